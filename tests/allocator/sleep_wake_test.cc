// Sleep and wake of pools (CachingAllocator::Sleep / Wake, pool_sleep.h) on the simulated device: contents
// kept or discarded as asked at unchanged addresses, the rules while a pool sleeps, and driver failures
// injected at every call of a sleep or wake leaving each pool asleep or awake, never half, with nothing
// leaked. The simulated device counts what is outstanding (SimCounters), so a leak shows as a number.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/private_pool.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class SleepWakeTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeAllocator(/*expandable=*/true); }
  void TearDown() override {
    route_ = PoolRoute();
    pools_.clear();
    allocator_.reset();
    if (sim_ != nullptr) ExpectNothingOutstanding();
  }

  void MakeAllocator(bool expandable, SimDriverOptions options = {}) {
    route_ = PoolRoute();
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
  }

  // A new pool with `tag`; allocations of this thread go to it while `route_` is open (RouteTo).
  PoolId NewPool(std::string tag) {
    PoolOptions options;
    options.tag = std::move(tag);
    absl::StatusOr<PrivatePool> pool = allocator_->CreatePool(options);
    EXPECT_TRUE(pool.ok()) << pool.status();
    pools_.push_back(*std::move(pool));
    return pools_.back().id();
  }
  void RouteTo(PoolId id) {
    route_ = PoolRoute();
    if (id == kDefaultPool) return;
    for (const PrivatePool& pool : pools_) {
      if (pool.id() != id) continue;
      absl::StatusOr<PoolRoute> route =
          allocator_->BeginAllocateToPool(pool, PoolRouteFilter::ForCallingThread());
      ASSERT_TRUE(route.ok()) << route.status();
      route_ = *std::move(route);
    }
  }
  DevicePtr Alloc(std::size_t bytes) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    ExpectInvariants();
    return p.ok() ? *p : 0;
  }
  void ExpectInvariants() {
    const absl::Status s = allocator_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }
  // Writes `byte` + i to byte i of [ptr, ptr + bytes), through the device.
  void Fill(DevicePtr ptr, std::size_t bytes, std::uint8_t byte) {
    std::vector<std::uint8_t> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(byte + i);
    ASSERT_OK(sim_->CopyHostToDevice(ptr, data.data(), bytes));
  }
  // Whether [ptr, ptr + bytes) holds what Fill(ptr, bytes, byte) wrote.
  bool Holds(DevicePtr ptr, std::size_t bytes, std::uint8_t byte) {
    std::vector<std::uint8_t> data(bytes);
    if (!sim_->CopyDeviceToHost(data.data(), ptr, bytes).ok()) return false;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (data[i] != static_cast<std::uint8_t>(byte + i)) return false;
    }
    return true;
  }
  bool AllZero(DevicePtr ptr, std::size_t bytes) {
    std::vector<std::uint8_t> data(bytes, 1);
    if (!sim_->CopyDeviceToHost(data.data(), ptr, bytes).ok()) return false;
    for (std::uint8_t b : data) {
      if (b != 0) return false;
    }
    return true;
  }
  PoolStats StatsOf(PoolId id) {
    absl::StatusOr<PoolStats> stats = allocator_->GetPoolStats(id);
    EXPECT_TRUE(stats.ok()) << stats.status();
    return stats.ok() ? *stats : PoolStats{};
  }
  bool Asleep(PoolId id) {
    absl::StatusOr<SleepState> state = allocator_->GetSleepState(id);
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() && state->asleep;
  }
  std::int64_t Reserved() { return allocator_->GetStats().reserved_bytes.all().current; }
  void ExpectNothingOutstanding() {
    const SimCounters c = sim_->Counters();
    EXPECT_EQ(c.reservations, 0u);
    EXPECT_EQ(c.handles, 0u);
    EXPECT_EQ(c.mappings, 0u);
    EXPECT_EQ(c.allocations, 0u);
    EXPECT_EQ(c.host_allocations, 0u);
    EXPECT_EQ(c.host_bytes, 0u);
    EXPECT_EQ(c.illegal_accesses, 0u);
  }
  static SleepRequest SleepPool(PoolId id, SleepMode mode) { return Request(SleepScope::Pool(id), mode); }
  static SleepRequest Request(SleepScope scope, SleepMode mode) {
    SleepRequest request;
    request.scope = std::move(scope);
    request.mode = mode;
    return request;
  }
  static WakeRequest WakePool(PoolId id) { return WakeRequest{.scope = SleepScope::Pool(id)}; }

  // A history event as (action, address, size).
  using Event = std::tuple<HistoryAction, std::uint64_t, std::uint64_t>;
  static std::vector<Event> EventsOf(const MemorySnapshot& snapshot) {
    std::vector<Event> out;
    for (const HistoryEvent& e : snapshot.history) out.emplace_back(e.action, e.address, e.size);
    return out;
  }
  std::vector<Event> History() { return EventsOf(allocator_->TakeSnapshot("", /*record_event=*/false)); }
  // The chunks the history says are asleep (each slept and not woken since) are exactly the snapshot's
  // sleeping ranges; no chunk sleeps twice or wakes without having slept. The history must cover every
  // sleep and wake of the allocator.
  void ExpectHistoryAgreesWithTheSleepingRanges() {
    const MemorySnapshot snapshot = allocator_->TakeSnapshot("", /*record_event=*/false);
    std::map<std::uint64_t, std::uint64_t> sleeping;  // chunk address -> size
    for (const HistoryEvent& e : snapshot.history) {
      if (e.action == HistoryAction::kSleep) {
        EXPECT_TRUE(sleeping.emplace(e.address, e.size).second) << "chunk 0x" << std::hex << e.address;
      } else if (e.action == HistoryAction::kWake) {
        auto it = sleeping.find(e.address);
        ASSERT_NE(it, sleeping.end()) << "chunk 0x" << std::hex << e.address << " woke, never slept";
        EXPECT_EQ(it->second, e.size);
        sleeping.erase(it);
      }
    }
    std::map<std::uint64_t, std::uint64_t> asleep;
    for (const SegmentSnapshot& segment : snapshot.segments) {
      for (const MappedRange& r : segment.asleep) asleep.emplace(segment.address + r.offset, r.size);
    }
    EXPECT_EQ(Coalesced(sleeping), Coalesced(asleep));
  }
  // Touching ranges joined, as a snapshot joins sleeping chunks.
  static std::vector<std::pair<std::uint64_t, std::uint64_t>> Coalesced(
      const std::map<std::uint64_t, std::uint64_t>& ranges) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> out;  // [begin, end)
    for (const auto& [begin, size] : ranges) {
      if (!out.empty() && out.back().second == begin) {
        out.back().second += size;
      } else {
        out.emplace_back(begin, begin + size);
      }
    }
    return out;
  }

  std::shared_ptr<SimDriver> sim_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<PrivatePool> pools_;
  PoolRoute route_;
};

TEST_F(SleepWakeTest, BackupKeepsContentsAtTheSameAddressesAndReleasesTheMemoryMeanwhile) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);  // one 2 MiB chunk
  const DevicePtr b = Alloc(4 * kMiB);  // one 4 MiB chunk
  Fill(a, 2 * kMiB, 7);
  Fill(b, 4 * kMiB, 91);
  ASSERT_EQ(Reserved(), static_cast<std::int64_t>(6 * kMiB));
  ASSERT_EQ(sim_->Counters().handle_bytes, 6 * kMiB);

  ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)));
  EXPECT_EQ(slept.bytes_released, 6 * kMiB);
  EXPECT_EQ(slept.bytes_backed_up, 6 * kMiB);
  EXPECT_EQ(slept.pools, std::vector<PoolId>{pool});
  ExpectInvariants();
  EXPECT_EQ(Reserved(), 0);
  const PoolStats asleep = StatsOf(pool);
  EXPECT_TRUE(asleep.asleep);
  EXPECT_EQ(asleep.reserved_bytes, 0u);
  EXPECT_EQ(asleep.sleeping_bytes, 6 * kMiB);
  EXPECT_EQ(asleep.backup_bytes, 6 * kMiB);
  EXPECT_EQ(asleep.allocated_bytes, 6 * kMiB);  // live blocks stay live
  EXPECT_EQ(asleep.live_blocks, 2u);
  EXPECT_EQ(sim_->Counters().handles, 0u);
  EXPECT_EQ(sim_->Counters().mappings, 0u);
  EXPECT_EQ(sim_->Counters().host_bytes, 6 * kMiB);
  EXPECT_EQ(sim_->Counters().reservations, 1u);  // the addresses stay reserved

  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakePool(pool)));
  EXPECT_EQ(woke.bytes_mapped, 6 * kMiB);
  EXPECT_EQ(woke.bytes_restored, 6 * kMiB);
  EXPECT_EQ(woke.pools, std::vector<PoolId>{pool});
  ExpectInvariants();
  EXPECT_TRUE(Holds(a, 2 * kMiB, 7));
  EXPECT_TRUE(Holds(b, 4 * kMiB, 91));
  EXPECT_EQ(Reserved(), static_cast<std::int64_t>(6 * kMiB));
  const PoolStats awake = StatsOf(pool);
  EXPECT_FALSE(awake.asleep);
  EXPECT_EQ(awake.sleeping_bytes, 0u);
  EXPECT_EQ(awake.backup_bytes, 6 * kMiB);  // the pinned buffer, kept for the next backed-up sleep
  EXPECT_EQ(awake.reserved_bytes, 6 * kMiB);
  EXPECT_EQ(sim_->Counters().host_allocations, 1u);
  EXPECT_EQ(sim_->Counters().handle_bytes, 6 * kMiB);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(allocator_->Free(b));
  ExpectInvariants();
  ASSERT_OK(allocator_->EmptyCache());  // cached memory, device and pinned host alike, goes
  EXPECT_EQ(StatsOf(pool).backup_bytes, 0u);
  EXPECT_EQ(sim_->Counters().host_allocations, 0u);
  EXPECT_EQ(sim_->Counters().host_bytes, 0u);
  ExpectInvariants();
}

// Pinning is the slow part of a backup (about 25 times the copy on an H200), so a pool that sleeps again
// reuses the buffer its last wake kept while it is large enough; a larger pool pins a new one.
TEST_F(SleepWakeTest, ASecondBackedUpSleepReusesThePinnedMemoryTheWakeKept) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  route_ = PoolRoute();
  for (int cycle = 0; cycle < 3; ++cycle) {
    SCOPED_TRACE(::testing::Message() << "cycle " << cycle);
    Fill(a, 2 * kMiB, static_cast<std::uint8_t>(10 + cycle));
    Fill(b, 4 * kMiB, static_cast<std::uint8_t>(20 + cycle));
    ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)));
    EXPECT_EQ(slept.bytes_backed_up, 6 * kMiB);
    EXPECT_EQ(StatsOf(pool).backup_bytes, 6 * kMiB);
    ExpectInvariants();
    ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
    ExpectInvariants();
    EXPECT_TRUE(Holds(a, 2 * kMiB, static_cast<std::uint8_t>(10 + cycle)));
    EXPECT_TRUE(Holds(b, 4 * kMiB, static_cast<std::uint8_t>(20 + cycle)));
  }
  EXPECT_EQ(sim_->CallCount(SimCall::kHostAlloc), 1u);
  EXPECT_EQ(sim_->CallCount(SimCall::kHostFree), 0u);
  EXPECT_EQ(sim_->Counters().host_bytes, 6 * kMiB);

  // The pool grows past the buffer: the sleep frees it and pins one of the new size.
  RouteTo(pool);
  const DevicePtr c = Alloc(2 * kMiB);
  route_ = PoolRoute();
  Fill(c, 2 * kMiB, 33);
  ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)));
  EXPECT_EQ(slept.bytes_backed_up, 8 * kMiB);
  EXPECT_EQ(sim_->CallCount(SimCall::kHostAlloc), 2u);
  EXPECT_EQ(sim_->CallCount(SimCall::kHostFree), 1u);
  EXPECT_EQ(sim_->Counters().host_bytes, 8 * kMiB);
  ExpectInvariants();
  // A wake told not to keep the buffer frees it.
  ASSERT_OK(
      allocator_->Wake(WakeRequest{.scope = SleepScope::Pool(pool), .keep_backup_memory = false}).status());
  EXPECT_TRUE(Holds(c, 2 * kMiB, 33));
  EXPECT_EQ(StatsOf(pool).backup_bytes, 0u);
  EXPECT_EQ(sim_->Counters().host_allocations, 0u);
  ExpectInvariants();
  for (DevicePtr p : {a, b, c}) ASSERT_OK(allocator_->Free(p));
}

TEST_F(SleepWakeTest, ADiscardingSleepKeepsThePinnedBufferOfAnEarlierBackup) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  route_ = PoolRoute();
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kDiscard)).status());
  EXPECT_EQ(StatsOf(pool).backup_bytes, 2 * kMiB);  // kept, not used
  EXPECT_EQ(sim_->Counters().host_bytes, 2 * kMiB);
  ExpectInvariants();
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  Fill(a, 2 * kMiB, 44);
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  EXPECT_TRUE(Holds(a, 2 * kMiB, 44));
  EXPECT_EQ(sim_->CallCount(SimCall::kHostAlloc), 1u);
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(sim_->Counters().host_allocations, 0u);
  ExpectInvariants();
}

TEST_F(SleepWakeTest, DiscardCopiesNothingAndWakesFreshMemoryAtTheSameAddresses) {
  const PoolId pool = NewPool("kv");
  RouteTo(pool);
  const DevicePtr a = Alloc(4 * kMiB);
  Fill(a, 4 * kMiB, 3);
  ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(SleepPool(pool, SleepMode::kDiscard)));
  EXPECT_EQ(slept.bytes_released, 4 * kMiB);
  EXPECT_EQ(slept.bytes_backed_up, 0u);
  EXPECT_EQ(sim_->CallCount(SimCall::kHostAlloc), 0u);
  EXPECT_EQ(StatsOf(pool).backup_bytes, 0u);
  ExpectInvariants();
  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakePool(pool)));
  EXPECT_EQ(woke.bytes_mapped, 4 * kMiB);
  EXPECT_EQ(woke.bytes_restored, 0u);
  // Fresh memory: the simulated device's new handles hold zeros (a GPU's hold anything).
  EXPECT_TRUE(AllZero(a, 4 * kMiB));
  ExpectInvariants();
  // The block is the same block: it frees once, and the pool serves again.
  ASSERT_OK(allocator_->Free(a));
  EXPECT_EQ(Alloc(4 * kMiB), a);
}

TEST_F(SleepWakeTest, TheHistoryRecordsOneSleepAndOneWakePerChunkAndNothingElse) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);  // one chunk each, in one segment
  const DevicePtr b = Alloc(4 * kMiB);
  const DevicePtr c = Alloc(2 * kMiB);
  route_ = PoolRoute();
  ASSERT_EQ(b, a + 2 * kMiB);
  ASSERT_EQ(c, b + 4 * kMiB);
  // From here on the history holds the sleep's and the wake's events alone.
  ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));

  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  const MemorySnapshot asleep = allocator_->TakeSnapshot("asleep", /*record_event=*/false);
  const std::vector<Event> slept = {{HistoryAction::kSleep, a, 2 * kMiB},
                                    {HistoryAction::kSleep, b, 4 * kMiB},
                                    {HistoryAction::kSleep, c, 2 * kMiB}};
  EXPECT_EQ(EventsOf(asleep), slept);
  ExpectHistoryAgreesWithTheSleepingRanges();

  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  const MemorySnapshot awake = allocator_->TakeSnapshot("awake", /*record_event=*/false);
  std::vector<Event> both = slept;
  both.insert(both.end(), {{HistoryAction::kWake, a, 2 * kMiB},
                           {HistoryAction::kWake, b, 4 * kMiB},
                           {HistoryAction::kWake, c, 2 * kMiB}});
  EXPECT_EQ(EventsOf(awake), both);
  ExpectHistoryAgreesWithTheSleepingRanges();
  // Recorded as the segment's map and unmap events are: its stream, no pool id.
  for (const HistoryEvent& e : awake.history) {
    EXPECT_EQ(e.stream, static_cast<std::uint64_t>(kDefaultStream));
    EXPECT_EQ(e.pool_id, 0u);
  }
  // The reserved bytes moved with the events: all 8 MiB left at the sleep and came back at the wake.
  EXPECT_EQ(asleep.stats.reserved_bytes.all().current, 0);
  EXPECT_EQ(awake.stats.reserved_bytes.all().current, static_cast<std::int64_t>(8 * kMiB));
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(allocator_->Free(b));
  ASSERT_OK(allocator_->Free(c));
  ExpectInvariants();
}

// A whole-allocator sleep records each pool's chunks in pool order; a pool already asleep, or one with no
// memory, records nothing.
TEST_F(SleepWakeTest, TheHistoryOfAWholeAllocatorSleepNamesEachPoolsChunksOnce) {
  const PoolId weights = NewPool("weights");
  const PoolId kv = NewPool("kv");
  NewPool("empty");
  RouteTo(weights);
  const DevicePtr w = Alloc(2 * kMiB);
  RouteTo(kv);
  const DevicePtr k = Alloc(4 * kMiB);
  route_ = PoolRoute();
  const DevicePtr d = Alloc(2 * kMiB);  // the default pool
  ASSERT_OK(allocator_->Sleep(SleepPool(kv, SleepMode::kDiscard)).status());
  ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));
  ASSERT_OK(allocator_->Sleep(Request(SleepScope::All(), SleepMode::kDiscard)).status());
  EXPECT_EQ(History(),
            (std::vector<Event>{{HistoryAction::kSleep, d, 2 * kMiB}, {HistoryAction::kSleep, w, 2 * kMiB}}));
  ASSERT_OK(allocator_->Wake(WakeRequest{.scope = SleepScope::All()}).status());
  // kv's chunk slept before the history began: its wake is recorded all the same.
  EXPECT_EQ(History(), (std::vector<Event>{{HistoryAction::kSleep, d, 2 * kMiB},
                                           {HistoryAction::kSleep, w, 2 * kMiB},
                                           {HistoryAction::kWake, d, 2 * kMiB},
                                           {HistoryAction::kWake, w, 2 * kMiB},
                                           {HistoryAction::kWake, k, 4 * kMiB}}));
  ASSERT_OK(allocator_->Free(w));
  ASSERT_OK(allocator_->Free(k));
  ASSERT_OK(allocator_->Free(d));
  ExpectInvariants();
}

TEST_F(SleepWakeTest, ASleepingPoolRefusesAllocationsNamingItselfAndItsTagButAcceptsFrees) {
  const PoolId pool = NewPool("kv-cache");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(2 * kMiB);
  Fill(a, 2 * kMiB, 1);
  Fill(b, 2 * kMiB, 2);
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  absl::StatusOr<DevicePtr> refused = allocator_->Allocate(kMiB);
  ASSERT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_EQ(
      std::string(refused.status().message()),
      absl::StrFormat("pool %d (tag 'kv-cache') is asleep: Wake() it before allocating from it (frees are "
                      "allowed)",
                      pool));
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(a));  // allowed: the block becomes free, its backup is not restored
  ExpectInvariants();
  EXPECT_EQ(StatsOf(pool).live_blocks, 1u);
  // Other pools, and the default pool, serve as ever.
  route_ = PoolRoute();
  const DevicePtr other = Alloc(kMiB);
  ASSERT_OK(allocator_->Free(other));
  // Checkpoints need the pool awake.
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->Checkpoint(pools_[0]).status()));

  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakePool(pool)));
  EXPECT_EQ(woke.bytes_restored, 2 * kMiB);  // b only
  EXPECT_TRUE(Holds(b, 2 * kMiB, 2));
  ExpectInvariants();
  RouteTo(pool);
  EXPECT_EQ(Alloc(2 * kMiB), a);  // the freed block, at its address
  ExpectInvariants();
}

TEST_F(SleepWakeTest, TheWholeAllocatorSleepsTheDefaultPoolToo) {
  const DevicePtr d = Alloc(2 * kMiB);
  const PoolId pool = NewPool("");
  RouteTo(pool);
  const DevicePtr p = Alloc(4 * kMiB);
  route_ = PoolRoute();
  Fill(d, 2 * kMiB, 10);
  Fill(p, 4 * kMiB, 20);
  ASSERT_OK_AND_ASSIGN(const SleepResult slept,
                       allocator_->Sleep(Request(SleepScope::All(), SleepMode::kBackup)));
  EXPECT_EQ(slept.bytes_released, 6 * kMiB);
  EXPECT_EQ(slept.pools, (std::vector<PoolId>{kDefaultPool, pool}));
  EXPECT_EQ(Reserved(), 0);
  EXPECT_TRUE(Asleep(kDefaultPool));
  ASSERT_OK_AND_ASSIGN(const SleepState state, allocator_->GetSleepState(kDefaultPool));
  EXPECT_EQ(state.sleeping_bytes, 2 * kMiB);
  EXPECT_EQ(state.backup_bytes, 2 * kMiB);
  absl::StatusOr<DevicePtr> refused = allocator_->Allocate(kMiB);
  ASSERT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_EQ(std::string(refused.status().message()),
            "the default pool is asleep: Wake() it before allocating from it (frees are allowed)");
  // EmptyCache leaves sleeping memory alone.
  ASSERT_OK(allocator_->EmptyCache());
  EXPECT_EQ(sim_->Counters().reservations, 2u);
  ExpectInvariants();
  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakeRequest{}));
  EXPECT_EQ(woke.bytes_mapped, 6 * kMiB);
  EXPECT_EQ(woke.pools, (std::vector<PoolId>{kDefaultPool, pool}));
  EXPECT_TRUE(Holds(d, 2 * kMiB, 10));
  EXPECT_TRUE(Holds(p, 4 * kMiB, 20));
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(d));
  ASSERT_OK(allocator_->Free(p));
}

TEST_F(SleepWakeTest, ATagSleepsExactlyThePoolsCreatedWithIt) {
  const PoolId kv1 = NewPool("kv");
  const PoolId weights = NewPool("weights");
  const PoolId kv2 = NewPool("kv");
  for (PoolId id : {kv1, weights, kv2}) {
    RouteTo(id);
    Fill(Alloc(2 * kMiB), 2 * kMiB, static_cast<std::uint8_t>(id));
  }
  route_ = PoolRoute();
  SleepRequest request = Request(SleepScope::Tag("kv"), SleepMode::kDiscard);
  request.pool_modes[kv2] = SleepMode::kBackup;
  ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(request));
  EXPECT_EQ(slept.pools, (std::vector<PoolId>{kv1, kv2}));
  EXPECT_EQ(slept.bytes_released, 4 * kMiB);
  EXPECT_EQ(slept.bytes_backed_up, 2 * kMiB);  // kv2 only, as its own mode says
  EXPECT_TRUE(Asleep(kv1));
  EXPECT_FALSE(Asleep(weights));
  EXPECT_TRUE(Asleep(kv2));
  EXPECT_EQ(StatsOf(weights).reserved_bytes, 2 * kMiB);
  // Asleep already: a second sleep leaves them as they are and lists none.
  ASSERT_OK_AND_ASSIGN(const SleepResult again,
                       allocator_->Sleep(Request(SleepScope::Tag("kv"), SleepMode::kDiscard)));
  EXPECT_TRUE(again.pools.empty());
  EXPECT_EQ(again.bytes_released, 0u);
  absl::StatusOr<SleepResult> unknown =
      allocator_->Sleep(Request(SleepScope::Tag("nope"), SleepMode::kDiscard));
  EXPECT_TRUE(absl::IsNotFound(unknown.status())) << unknown.status();
  EXPECT_EQ(unknown.status().message(), "no pool has the tag 'nope'");
  ExpectInvariants();
  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakeRequest{.scope = SleepScope::Tag("kv")}));
  EXPECT_EQ(woke.pools, (std::vector<PoolId>{kv1, kv2}));
  EXPECT_EQ(woke.bytes_restored, 2 * kMiB);
  EXPECT_FALSE(Asleep(kv1));
  EXPECT_FALSE(Asleep(kv2));
  ExpectInvariants();
}

TEST_F(SleepWakeTest, SleepAndWakeAreRefusedDuringACapture) {
  const PoolId pool = NewPool("graphs");
  RouteTo(pool);
  Alloc(2 * kMiB);
  route_ = PoolRoute();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim_->StreamCreate());
  ASSERT_OK(sim_->BeginCapture(s, CaptureMode::kGlobal));
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute capture,
                         allocator_->BeginAllocateToPool(pools_[0], PoolRouteFilter::ForCaptureOf(s)));
    absl::StatusOr<SleepResult> refused = allocator_->Sleep(SleepPool(pool, SleepMode::kBackup));
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    EXPECT_FALSE(Asleep(pool));
    ASSERT_OK(capture.End());
  }
  ASSERT_OK_AND_ASSIGN(const Graph graph, sim_->EndCapture(s));
  ASSERT_OK(sim_->GraphDestroy(graph));
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kDiscard)).status());
  ASSERT_OK(sim_->BeginCapture(s, CaptureMode::kGlobal));
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute capture,
                         allocator_->BeginAllocateToPool(pools_[0], PoolRouteFilter::ForCaptureOf(s)));
    absl::StatusOr<WakeResult> refused = allocator_->Wake(WakePool(pool));
    EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
    EXPECT_TRUE(Asleep(pool));
    ASSERT_OK(capture.End());
  }
  ASSERT_OK_AND_ASSIGN(const Graph graph2, sim_->EndCapture(s));
  ASSERT_OK(sim_->GraphDestroy(graph2));
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  ExpectInvariants();
  ASSERT_OK(sim_->StreamDestroy(s));
}

TEST_F(SleepWakeTest, RegularSegmentsAreRefusedUnlessWhollyFreeAndReleasedOnRequest) {
  MakeAllocator(/*expandable=*/false);
  const PoolId pool = NewPool("nccl");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  absl::StatusOr<SleepResult> refused = allocator_->Sleep(SleepPool(pool, SleepMode::kDiscard));
  ASSERT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_EQ(
      std::string(refused.status().message()),
      absl::StrFormat("Sleep: pool %d (tag 'nccl') has regular segments, which cannot keep their addresses "
                      "while asleep: 0x%x (%d bytes, in use); use expandable segments for pools that "
                      "sleep, or free their blocks and set SleepRequest::release_free_regular_segments",
                      pool, a, 20 * kMiB));  // a large request's regular segment is 20 MiB
  EXPECT_FALSE(Asleep(pool));
  // Asked to release free regular segments, but this one is in use: refused all the same.
  SleepRequest release = SleepPool(pool, SleepMode::kDiscard);
  release.release_free_regular_segments = true;
  EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->Sleep(release).status()));
  EXPECT_FALSE(Asleep(pool));
  EXPECT_EQ(sim_->Counters().allocations, 1u);
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(release));
  EXPECT_EQ(slept.pools, std::vector<PoolId>{pool});
  EXPECT_EQ(sim_->Counters().allocations, 0u);  // freed to the device
  EXPECT_EQ(StatsOf(pool).segments, 0u);
  EXPECT_EQ(Reserved(), 0);
  ExpectInvariants();
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  ExpectInvariants();
}

// A graph captured into a pool before the sleep replays into the same addresses after the wake, reading
// the contents the backup kept: CUDA graphs need not be captured again.
TEST_F(SleepWakeTest, AGraphCapturedBeforeTheSleepReplaysAfterTheWake) {
  const PoolId pool = NewPool("graphs");
  ASSERT_OK_AND_ASSIGN(const Stream s, sim_->StreamCreate());
  ASSERT_OK(sim_->BeginCapture(s, CaptureMode::kGlobal));
  DevicePtr counter = 0;
  {
    ASSERT_OK_AND_ASSIGN(PoolRoute capture,
                         allocator_->BeginAllocateToPool(pools_[0], PoolRouteFilter::ForCaptureOf(s)));
    ASSERT_OK_AND_ASSIGN(counter, allocator_->Allocate(2 * kMiB, s));
    // A host closure is the simulated device's kernel; device addresses are host addresses there.
    ASSERT_OK(sim_->LaunchHostFunction(s, [counter] { ++*reinterpret_cast<std::uint64_t*>(counter); }));
    ASSERT_OK(capture.End());
  }
  ASSERT_OK_AND_ASSIGN(const Graph graph, sim_->EndCapture(s));
  ASSERT_OK_AND_ASSIGN(GraphPin pin, allocator_->PinForGraph(pools_[0]));
  ASSERT_OK_AND_ASSIGN(const GraphExec exec, sim_->GraphInstantiate(graph));
  const std::uint64_t zero = 0;
  ASSERT_OK(sim_->CopyHostToDevice(counter, &zero, sizeof(zero)));
  for (int launch = 0; launch < 3; ++launch) ASSERT_OK(sim_->GraphLaunch(exec, s));
  ASSERT_OK(sim_->StreamSynchronize(s));
  for (int cycle = 1; cycle <= 3; ++cycle) {
    SCOPED_TRACE(cycle);
    // A graph pins its pool against EmptyCache, not against a sleep asked for by name.
    ASSERT_OK_AND_ASSIGN(const SleepResult slept, allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)));
    EXPECT_EQ(slept.bytes_released, 2 * kMiB);
    EXPECT_EQ(sim_->Counters().mappings, 0u);
    ExpectInvariants();
    ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
    ExpectInvariants();
    ASSERT_OK(sim_->GraphLaunch(exec, s));
    ASSERT_OK(sim_->StreamSynchronize(s));
    std::uint64_t value = 0;
    ASSERT_OK(sim_->CopyDeviceToHost(&value, counter, sizeof(value)));
    EXPECT_EQ(value, static_cast<std::uint64_t>(3 + cycle));
  }
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  ASSERT_OK(sim_->GraphExecDestroy(exec));
  ASSERT_OK(sim_->GraphDestroy(graph));
  pin.Reset();
  ASSERT_OK(allocator_->Free(counter));
  ASSERT_OK(sim_->StreamDestroy(s));
  ExpectInvariants();
}

// An unmap is not stream-ordered: work queued on a pool's memory runs before the sleep copies or unmaps it.
TEST_F(SleepWakeTest, WorkQueuedOnThePoolRunsBeforeTheSleepBacksUpAndUnmaps) {
  SimDriverOptions manual;
  manual.manual_completion = true;
  MakeAllocator(/*expandable=*/true, manual);
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  route_ = PoolRoute();
  ASSERT_OK_AND_ASSIGN(const Stream s, sim_->StreamCreate());
  ASSERT_OK(sim_->MemsetAsync(a, 0x6b, 2 * kMiB, s));
  ASSERT_EQ(sim_->Counters().pending_work, 1u);
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  EXPECT_EQ(sim_->Counters().pending_work, 0u);
  EXPECT_EQ(sim_->Counters().illegal_accesses, 0u);
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  std::vector<std::uint8_t> data(2 * kMiB);
  ASSERT_OK(sim_->CopyDeviceToHost(data.data(), a, data.size()));
  EXPECT_EQ(data, std::vector<std::uint8_t>(2 * kMiB, 0x6b));
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(sim_->StreamDestroy(s));
}

// A snapshot shows a sleeping pool's ranges as asleep, its blocks as they were, and stays valid (through
// JSON too); the statistics and the snapshot agree on what is reserved.
TEST_F(SleepWakeTest, ASnapshotShowsSleepingRangesWithTheirBlocksAndReadsBack) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  route_ = PoolRoute();
  ASSERT_OK(allocator_->Free(b));
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kDiscard)).status());
  const MemorySnapshot snapshot = allocator_->TakeSnapshot("asleep", /*record_event=*/false);
  ASSERT_OK(ValidateSnapshot(snapshot));
  ASSERT_EQ(snapshot.segments.size(), 1u);
  const SegmentSnapshot& segment = snapshot.segments[0];
  EXPECT_EQ(segment.pool_id, pool);
  EXPECT_EQ(segment.address, a);
  EXPECT_TRUE(segment.mapped.empty());
  EXPECT_EQ(segment.asleep, (std::vector<MappedRange>{{0, 6 * kMiB, true}}));
  EXPECT_EQ(segment.ReservedBytes(), 0u);
  ASSERT_GE(segment.blocks.size(), 2u);
  EXPECT_EQ(segment.blocks[0].address, a);
  EXPECT_EQ(segment.blocks[0].state, BlockState::kAllocated);
  EXPECT_EQ(segment.blocks[1].state, BlockState::kFree);
  ASSERT_OK_AND_ASSIGN(const MemorySnapshot read, SnapshotFromJson(SnapshotToJson(snapshot)));
  EXPECT_EQ(read.segments, snapshot.segments);
  ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
  const MemorySnapshot awake = allocator_->TakeSnapshot("awake", /*record_event=*/false);
  ASSERT_OK(ValidateSnapshot(awake));
  EXPECT_TRUE(awake.segments[0].asleep.empty());
  EXPECT_EQ(awake.segments[0].mapped, (std::vector<MappedRange>{{0, 6 * kMiB, true}}));
  ASSERT_OK(allocator_->Free(a));
  ExpectInvariants();
}

// Every call a sleep makes, failed in turn: the pool is asleep or awake, never half; its contents survive
// either way (the backup, or the memory never released); nothing is left behind (TearDown's counters).
TEST_F(SleepWakeTest, AFailureAtAnyCallOfASleepLeavesThePoolAsleepOrAwakeWithItsContents) {
  const SimCall calls[] = {SimCall::kStreamSynchronize, SimCall::kHostAlloc,  SimCall::kCopy,
                           SimCall::kMemUnmap,          SimCall::kMemRelease, SimCall::kHostFree};
  int failures = 0;
  for (SimCall call : calls) {
    for (int nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(::testing::Message() << "call " << static_cast<int>(call) << ", nth " << nth);
      MakeAllocator(/*expandable=*/true);
      const PoolId pool = NewPool("weights");
      RouteTo(pool);
      const DevicePtr a = Alloc(2 * kMiB);
      const DevicePtr b = Alloc(4 * kMiB);
      route_ = PoolRoute();
      Fill(a, 2 * kMiB, 5);
      Fill(b, 4 * kMiB, 6);
      ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));
      sim_->InjectFault(call, nth, DriverResult::kOutOfMemory);
      const std::uint64_t injected = sim_->InjectedFaultCount();
      absl::StatusOr<SleepResult> slept = allocator_->Sleep(SleepPool(pool, SleepMode::kBackup));
      const bool failed = sim_->InjectedFaultCount() > injected;
      sim_->ClearFaults();
      ExpectInvariants();
      ExpectHistoryAgreesWithTheSleepingRanges();
      EXPECT_EQ(slept.ok(), !failed) << slept.status();
      failures += failed ? 1 : 0;
      if (!slept.ok() && !Asleep(pool)) {
        // Undone: awake, untouched, no backup held, nothing in the history.
        EXPECT_EQ(StatsOf(pool).reserved_bytes, 6 * kMiB);
        EXPECT_EQ(sim_->Counters().host_allocations, 0u);
        EXPECT_EQ(History(), std::vector<Event>{});
        RouteTo(pool);
        ASSERT_OK(allocator_->Free(Alloc(kMiB)));  // allocations allowed (a 2 MiB chunk more, free)
        route_ = PoolRoute();
        ASSERT_OK(allocator_->EmptyPoolCache(pool));
      } else {
        EXPECT_TRUE(Asleep(pool));
        // What was released is out of the reserved bytes; what the driver kept mapped is still in them. The
        // history has a sleep for each chunk released (ExpectHistoryAgreesWithTheSleepingRanges): here
        // both, or the one the driver let go.
        const PoolStats stats = StatsOf(pool);
        EXPECT_EQ(stats.reserved_bytes + stats.sleeping_bytes, 6 * kMiB);
        const std::vector<Event> both = {{HistoryAction::kSleep, a, 2 * kMiB},
                                         {HistoryAction::kSleep, b, 4 * kMiB}};
        if (call == SimCall::kMemUnmap && nth == 1) {
          EXPECT_EQ(History(), std::vector<Event>{both[1]});
        } else if (call == SimCall::kMemUnmap && nth == 2) {
          EXPECT_EQ(History(), std::vector<Event>{both[0]});
        } else {
          EXPECT_EQ(History(), both);
        }
        ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
        EXPECT_FALSE(Asleep(pool));
        ExpectHistoryAgreesWithTheSleepingRanges();
      }
      ExpectInvariants();
      EXPECT_TRUE(Holds(a, 2 * kMiB, 5));
      EXPECT_TRUE(Holds(b, 4 * kMiB, 6));
      EXPECT_EQ(StatsOf(pool).reserved_bytes, 6 * kMiB);
      ASSERT_OK(allocator_->Free(a));
      ASSERT_OK(allocator_->Free(b));
      ASSERT_OK(allocator_->EmptyCache());  // handles the driver refused to release go now
      ExpectInvariants();
      route_ = PoolRoute();
      pools_.clear();
      allocator_.reset();
      ExpectNothingOutstanding();
    }
  }
  // Two chunks, two blocks: one synchronization after the copies, one pinned allocation, two copies, two
  // unmaps, two releases; a sleep that succeeds frees no backup.
  EXPECT_EQ(failures, 8);
}

// Every call a wake makes, failed in turn: the pool stays asleep with its backup, or wakes whole; a second
// wake after a failed one restores everything; nothing is left behind.
TEST_F(SleepWakeTest, AFailureAtAnyCallOfAWakeLeavesThePoolAsleepWithItsBackup) {
  const SimCall calls[] = {SimCall::kMemCreate, SimCall::kMemMap, SimCall::kMemSetAccess, SimCall::kCopy,
                           SimCall::kStreamSynchronize};
  int failures = 0;
  for (SimCall call : calls) {
    for (int nth = 1; nth <= 3; ++nth) {
      SCOPED_TRACE(::testing::Message() << "call " << static_cast<int>(call) << ", nth " << nth);
      MakeAllocator(/*expandable=*/true);
      const PoolId pool = NewPool("weights");
      RouteTo(pool);
      const DevicePtr a = Alloc(2 * kMiB);
      const DevicePtr b = Alloc(4 * kMiB);
      route_ = PoolRoute();
      Fill(a, 2 * kMiB, 8);
      Fill(b, 4 * kMiB, 9);
      ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));
      ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
      const std::vector<Event> slept = {{HistoryAction::kSleep, a, 2 * kMiB},
                                        {HistoryAction::kSleep, b, 4 * kMiB}};
      sim_->InjectFault(call, nth, DriverResult::kOutOfMemory);
      const std::uint64_t injected = sim_->InjectedFaultCount();
      absl::StatusOr<WakeResult> woke = allocator_->Wake(WakePool(pool));
      const bool failed = sim_->InjectedFaultCount() > injected;
      sim_->ClearFaults();
      ExpectInvariants();
      EXPECT_EQ(woke.ok(), !failed) << woke.status();
      failures += failed ? 1 : 0;
      if (failed) {
        // Asleep as before: no memory mapped, the backup kept, allocations refused.
        EXPECT_TRUE(Asleep(pool));
        const PoolStats stats = StatsOf(pool);
        EXPECT_EQ(stats.reserved_bytes, 0u);
        EXPECT_EQ(stats.sleeping_bytes, 6 * kMiB);
        EXPECT_EQ(stats.backup_bytes, 6 * kMiB);
        EXPECT_EQ(sim_->Counters().mappings, 0u);
        EXPECT_EQ(History(), slept);  // no wake recorded for the one undone
        RouteTo(pool);
        EXPECT_TRUE(absl::IsFailedPrecondition(allocator_->Allocate(kMiB).status()));
        route_ = PoolRoute();
        ASSERT_OK(allocator_->Wake(WakePool(pool)).status());
      }
      EXPECT_FALSE(Asleep(pool));
      ExpectInvariants();
      std::vector<Event> both = slept;
      both.insert(both.end(), {{HistoryAction::kWake, a, 2 * kMiB}, {HistoryAction::kWake, b, 4 * kMiB}});
      EXPECT_EQ(History(), both);
      ExpectHistoryAgreesWithTheSleepingRanges();
      EXPECT_TRUE(Holds(a, 2 * kMiB, 8));
      EXPECT_TRUE(Holds(b, 4 * kMiB, 9));
      EXPECT_EQ(StatsOf(pool).reserved_bytes, 6 * kMiB);
      ASSERT_OK(allocator_->Free(a));
      ASSERT_OK(allocator_->Free(b));
      ASSERT_OK(allocator_->EmptyCache());
      ExpectInvariants();
      route_ = PoolRoute();
      pools_.clear();
      allocator_.reset();
      ExpectNothingOutstanding();
    }
  }
  // Two chunks, two blocks: two creates, two maps, two access grants, two copies, one synchronization; the
  // backup's buffer is kept, not freed (EmptyCache frees it).
  EXPECT_EQ(failures, 9);
}

// A wake fails after mapping a chunk, and the driver then refuses to unmap it: the chunk stays mapped,
// asleep, and the next wake uses it as it is.
TEST_F(SleepWakeTest, AChunkAFailedWakeCouldNotUnmapIsReusedByTheNextWake) {
  const PoolId pool = NewPool("weights");
  RouteTo(pool);
  const DevicePtr a = Alloc(2 * kMiB);
  const DevicePtr b = Alloc(4 * kMiB);
  route_ = PoolRoute();
  Fill(a, 2 * kMiB, 30);
  Fill(b, 4 * kMiB, 40);
  ASSERT_OK(allocator_->RecordHistory(HistoryOptions{.enabled = true}));
  ASSERT_OK(allocator_->Sleep(SleepPool(pool, SleepMode::kBackup)).status());
  sim_->InjectFault(SimCall::kMemMap, 2, DriverResult::kOutOfMemory);    // b's chunk
  sim_->InjectFault(SimCall::kMemUnmap, 1, DriverResult::kOutOfMemory);  // the undo of a's
  EXPECT_FALSE(allocator_->Wake(WakePool(pool)).ok());
  sim_->ClearFaults();
  EXPECT_TRUE(Asleep(pool));
  EXPECT_EQ(sim_->Counters().mappings, 1u);
  EXPECT_EQ(sim_->Counters().handles, 1u);
  EXPECT_EQ(StatsOf(pool).sleeping_bytes, 6 * kMiB);
  ExpectInvariants();
  // a's chunk has memory again, but is not the pool's until a wake stands: no wake in the history yet.
  const std::vector<Event> slept = {{HistoryAction::kSleep, a, 2 * kMiB},
                                    {HistoryAction::kSleep, b, 4 * kMiB}};
  EXPECT_EQ(History(), slept);
  ExpectHistoryAgreesWithTheSleepingRanges();
  const std::uint64_t creates = sim_->CallCount(SimCall::kMemCreate);
  ASSERT_OK_AND_ASSIGN(const WakeResult woke, allocator_->Wake(WakePool(pool)));
  EXPECT_EQ(woke.bytes_mapped, 6 * kMiB);
  std::vector<Event> both = slept;
  both.insert(both.end(), {{HistoryAction::kWake, a, 2 * kMiB}, {HistoryAction::kWake, b, 4 * kMiB}});
  EXPECT_EQ(History(), both);
  ExpectHistoryAgreesWithTheSleepingRanges();
  EXPECT_EQ(sim_->CallCount(SimCall::kMemCreate), creates + 1);  // b's only: a's chunk was still mapped
  EXPECT_TRUE(Holds(a, 2 * kMiB, 30));
  EXPECT_TRUE(Holds(b, 4 * kMiB, 40));
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(a));
  ASSERT_OK(allocator_->Free(b));
}

// A wake takes cached handles of a chunk's size before it creates new ones.
TEST_F(SleepWakeTest, AWakeReusesCachedHandlesOfTheSameSize) {
  const PoolId kv = NewPool("kv");
  RouteTo(kv);
  const DevicePtr a = Alloc(2 * kMiB);
  route_ = PoolRoute();
  ASSERT_OK(allocator_->Sleep(SleepPool(kv, SleepMode::kDiscard)).status());
  // A 2 MiB handle goes to the handle cache: a default-pool block freed and its chunk unmapped by a
  // growth that needs more room is too roundabout; a release the driver refuses is direct.
  const DevicePtr d = Alloc(2 * kMiB);
  ASSERT_OK(allocator_->Free(d));
  sim_->InjectFault(SimCall::kMemRelease, 1, DriverResult::kOutOfMemory);
  EXPECT_FALSE(allocator_->EmptyCache().ok());  // unmapped; its handle refused to go: cached
  sim_->ClearFaults();
  ASSERT_EQ(sim_->Counters().handles, 1u);
  const std::uint64_t creates = sim_->CallCount(SimCall::kMemCreate);
  ASSERT_OK(allocator_->Wake(WakePool(kv)).status());
  EXPECT_EQ(sim_->CallCount(SimCall::kMemCreate), creates);
  EXPECT_EQ(sim_->Counters().handles, 1u);
  ExpectInvariants();
  ASSERT_OK(allocator_->Free(a));
}

}  // namespace
}  // namespace graphalloc
