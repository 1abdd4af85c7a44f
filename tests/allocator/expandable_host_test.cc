// Expandable segments driven through a recording ExpandableHost (expandable_host.h), without an allocator:
// which of the coordinator's operations a growth, a release and a quarantine repair ask for, in which order
// and under which lock, and which driver calls they make between them. The host keeps real parts (a shard,
// a block cache, a segment ledger, a budget) so that the blocks behave as they do in the allocator, but
// takes no real lock: it counts the locks it hands out, and every operation the interface documents as
// needing one checks that it is held, while every driver call and every mapping observer checks that no
// shard or device lock is (the capture gate may be held: an unmap waits for the device under it). The
// same processes inside a real allocator are expandable_segments_test and expandable_unmap_order_test.
#include "graphalloc/allocator/core/expandable_host.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/core/expandable_segments.h"
#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/mapping_observer.h"
#include "graphalloc/allocator/core/memory_budget.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/shard_table.h"
#include "graphalloc/allocator/device/forwarding_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr std::size_t kGran = 2 * kMiB;

// What the host, the driver and the observer were asked, in one order. Addresses are offsets from the
// first reservation, in MiB.
struct Log {
  std::vector<std::string> entries;
  DevicePtr base = 0;
  int shard_locks = 0;
  int device_locks = 0;
  int gates = 0;
  // At the allocator's end the cached handles go back under the device lock (nothing else runs then).
  bool at_exit = false;

  std::string At(DevicePtr ptr) const { return absl::StrCat("@", (ptr - base) / kMiB); }
  static std::string MiB(std::size_t bytes) { return absl::StrCat(bytes / kMiB, "M"); }
  void Add(std::string entry) { entries.push_back(std::move(entry)); }
  // A driver call, or an observer told: no shard or device lock may be held.
  void Unlocked(std::string entry) {
    if (at_exit) return Add(std::move(entry));
    EXPECT_EQ(shard_locks, 0) << entry << " with a shard lock held";
    EXPECT_EQ(device_locks, 0) << entry << " with the device lock held";
    Add(std::move(entry));
  }
  std::vector<std::string> Take() { return std::exchange(entries, {}); }
};

// The simulated device, each call logged (and checked to come with no lock held).
class LoggingDriver final : public ForwardingDriver {
 public:
  LoggingDriver(std::shared_ptr<SimDriver> sim, Log& log)
      : ForwardingDriver(sim), sim_(std::move(sim)), log_(log) {}

  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment) override {
    absl::StatusOr<DevicePtr> base = ForwardingDriver::AddressReserve(size, alignment);
    if (base.ok() && log_.base == 0) log_.base = *base;
    log_.Unlocked(absl::StrCat("AddressReserve ", base.ok() ? log_.At(*base) : "failed"));
    return base;
  }
  absl::StatusOr<PhysicalHandle> MemCreate(std::size_t size) override {
    log_.Unlocked(absl::StrCat("MemCreate ", Log::MiB(size)));
    return ForwardingDriver::MemCreate(size);
  }
  absl::Status MemRelease(PhysicalHandle handle) override {
    log_.Unlocked("MemRelease");
    return ForwardingDriver::MemRelease(handle);
  }
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override {
    log_.Unlocked(absl::StrCat("MemMap ", log_.At(ptr), " ", Log::MiB(size)));
    return ForwardingDriver::MemMap(ptr, size, handle);
  }
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override {
    log_.Unlocked(absl::StrCat("MemUnmap ", log_.At(ptr), " ", Log::MiB(size)));
    return ForwardingDriver::MemUnmap(ptr, size);
  }
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) override {
    log_.Unlocked(absl::StrCat("MemSetAccess ", log_.At(ptr), " ", Log::MiB(size)));
    return ForwardingDriver::MemSetAccess(ptr, size, peers);
  }

  SimDriver& sim() { return *sim_; }

 private:
  std::shared_ptr<SimDriver> sim_;
  Log& log_;
};

class LoggingObserver final : public MappingObserver {
 public:
  explicit LoggingObserver(Log& log) : log_(log) {}
  void OnMap(const MappingEvent& e) override {
    log_.Unlocked(absl::StrCat("observer map ", log_.At(e.ptr), " ", Log::MiB(e.size)));
  }
  void OnUnmap(const MappingEvent& e) override {
    log_.Unlocked(absl::StrCat("observer unmap ", log_.At(e.ptr), " ", Log::MiB(e.size)));
  }

 private:
  Log& log_;
};

// The host: real parts, counted locks.
class RecordingHost final : public ExpandableHost {
 public:
  explicit RecordingHost(Log& log) : log_(log) {}

  std::unique_ptr<Lock> LockShard(StreamShard& /*shard*/) override {
    EXPECT_EQ(log_.shard_locks + log_.device_locks, 0) << "a shard lock taken with a lock held";
    return std::make_unique<Counted>(log_, log_.shard_locks, "shard");
  }
  std::unique_ptr<Lock> LockDevice() override {
    EXPECT_EQ(log_.device_locks, 0) << "the device lock taken twice";
    return std::make_unique<Counted>(log_, log_.device_locks, "device");
  }
  std::unique_ptr<AllShards> LockAllShards() override {
    EXPECT_EQ(log_.shard_locks + log_.device_locks, 0) << "every shard locked with a lock held";
    return std::make_unique<All>(log_, shards);
  }
  std::unique_ptr<UnmapGate> EnterUnmapGate() override {
    EXPECT_EQ(log_.shard_locks + log_.device_locks + log_.gates, 0) << "the gate entered with a lock held";
    return std::make_unique<Gate>(log_);
  }
  void AssertDeviceLockHeld() const override { EXPECT_EQ(log_.device_locks, 1) << "device lock not held"; }

  DevicePtr AllocateBestFit(StreamShard& shard, const AllocationRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked("best_fit");
    return blocks.AllocateBestFit(shard, request);
  }
  GrowthPlanner Planner(StreamShard& shard, BlockPool& pool, std::size_t size, std::size_t granularity,
                        GrowthPlan* plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked(absl::StrCat("planner ", Log::MiB(size)));
    return GrowthPlanner(shard, pool, blocks, size, granularity, plan);
  }
  Block* SplitOff(StreamShard& shard, Block* b, DevicePtr at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked(absl::StrCat("split_off ", log_.At(at)));
    return blocks.SplitOff(shard, b, at);
  }
  Block* CarveRange(StreamShard& shard, Block* b, DevicePtr begin, DevicePtr end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked(absl::StrCat("carve_range ", log_.At(begin), " ", Log::MiB(end - begin)));
    return blocks.CarveRange(shard, b, begin, end);
  }
  void ReturnToIndex(StreamShard& shard, Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked(absl::StrCat("return_to_index ", log_.At(b->ptr), " ", Log::MiB(b->size),
                             b->mapped ? " mapped" : " unmapped"));
    blocks.ReturnToIndex(shard, b);
  }
  void FlushQuickCache(StreamShard& shard) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shard.mu) override {
    ShardLocked("flush_quick_cache");
    blocks.FlushQuickCache(shard);
  }

  void AddReservation(Segment* segment) override {
    DeviceLocked(absl::StrCat("add_reservation ", log_.At(segment->base)));
    ledger.AddReservation(segment);
  }
  void RemoveReservation(Segment* segment) override {
    DeviceLocked(absl::StrCat("remove_reservation ", log_.At(segment->base)));
    ledger.RemoveReservation(segment);
  }
  void ChunkMapped(Segment* segment, const ChunkPlacement& chunk) override {
    DeviceLocked(absl::StrCat("chunk_mapped ", log_.At(chunk.ptr), " ", Log::MiB(chunk.size)));
    ledger.ChunkMapped(segment, chunk);
  }
  void ChunkUnmapped(Segment* segment, const ChunkPlacement& chunk) override {
    DeviceLocked(absl::StrCat("chunk_unmapped ", log_.At(chunk.ptr), " ", Log::MiB(chunk.size)));
    ledger.ChunkUnmapped(segment, chunk);
  }
  std::vector<Segment*> Segments() const override {
    DeviceLocked("segments");
    std::vector<Segment*> out;
    for (const auto& [base, segment] : ledger) out.push_back(segment);
    return out;
  }
  Segment* FindSegment(DevicePtr base) const override {
    DeviceLocked("find_segment");
    return ledger.Find(base);
  }

  std::size_t Committed(std::size_t cached, std::size_t extra) const override {
    DeviceLocked(absl::StrCat("committed ", Log::MiB(cached), " ", Log::MiB(extra)));
    return budget.Committed(ledger.reserved_bytes(), cached, extra);
  }
  std::size_t Capacity() const override {
    DeviceLocked("capacity");
    return budget.capacity();
  }
  bool OverLimit(std::size_t cached, std::size_t extra) const override {
    DeviceLocked(absl::StrCat("over_limit ", Log::MiB(cached), " ", Log::MiB(extra)));
    return budget.OverLimit(ledger.reserved_bytes(), cached, extra);
  }
  bool AdmitNewHandles(std::size_t cached, std::size_t bytes) override {
    DeviceLocked(absl::StrCat("admit ", Log::MiB(cached), " ", Log::MiB(bytes)));
    return budget.AdmitNewHandles(ledger.reserved_bytes(), cached, bytes);
  }
  void BeginGrowth(std::size_t bytes) override {
    DeviceLocked(absl::StrCat("begin_growth ", Log::MiB(bytes)));
    budget.BeginGrowth(bytes);
  }
  void EndGrowth(std::size_t bytes) override {
    DeviceLocked(absl::StrCat("end_growth ", Log::MiB(bytes)));
    budget.EndGrowth(bytes);
  }
  std::size_t GrowthInFlight() const override {
    DeviceLocked("growth_in_flight");
    return budget.growth_in_flight();
  }

  bool CaptureUnderway() const override {
    log_.Add("capture_underway");
    return capturing;
  }

  bool capturing = false;  // what CaptureUnderway() answers

  // The real parts (the tests reach them directly, with the host's locks taken where they need them).
  Config config;
  HistoryRing history;
  ShardTable shards;
  BlockCache blocks{config, history};
  SegmentLedger ledger{config.max_split_size, history, 0};
  MemoryBudget budget{std::size_t{1} << 30};

 private:
  class Counted : public Lock {
   public:
    Counted(Log& log, int& count, const char* what) : log_(log), count_(count), what_(what) {
      ++count_;
      log_.Add(absl::StrCat("lock ", what_));
    }
    ~Counted() override {
      --count_;
      log_.Add(absl::StrCat("unlock ", what_));
    }

   private:
    Log& log_;
    int& count_;
    const char* what_;
  };
  class All final : public AllShards {
   public:
    All(Log& log, ShardTable& shards) : log_(log), shards_(shards) {
      ++log_.shard_locks;
      ++log_.device_locks;
      log_.Add("lock all");
    }
    ~All() override {
      --log_.shard_locks;
      --log_.device_locks;
      log_.Add("unlock all");
    }
    void ForEach(absl::FunctionRef<void(StreamShard&)> f) const override {
      shards_.ForEach([&](StreamShard* s) { f(*s); });
    }

   private:
    Log& log_;
    ShardTable& shards_;
  };
  class Gate final : public UnmapGate {
   public:
    explicit Gate(Log& log) : log_(log) {
      ++log_.gates;
      log_.Add("enter gate");
    }
    ~Gate() override {
      --log_.gates;
      log_.Add("leave gate");
    }
    absl::Status WaitForWorkBeforeUnmap(std::optional<Stream> stream) override {
      EXPECT_EQ(log_.gates, 1);
      log_.Add(stream.has_value() ? "wait stream" : "wait device");
      return absl::OkStatus();
    }

   private:
    Log& log_;
  };

  void ShardLocked(std::string what) const {
    EXPECT_EQ(log_.shard_locks, 1) << what << " needs the shard's lock";
    log_.Add(std::move(what));
  }
  void DeviceLocked(std::string what) const {
    EXPECT_EQ(log_.device_locks, 1) << what << " needs the device lock";
    log_.Add(std::move(what));
  }

  Log& log_;
};

class ExpandableHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<SimDriver> sim,
                         SimDriver::Create({.capacity = std::size_t{1} << 30, .granularity = kGran}));
    driver_ = std::make_unique<LoggingDriver>(std::shared_ptr<SimDriver>(std::move(sim)), log_);
    ASSERT_OK(hooks_.Add(std::make_shared<LoggingObserver>(log_)));
    expandable_ = std::make_unique<ExpandableSegments>(ExpandableSegments::Parts{host_, *driver_, hooks_});
    MutexLock lock(&host_.shards.set_mu());
    shard_ = host_.shards.Add(kDefaultPool, kDefaultStream, nullptr);
  }
  void TearDown() override {
    // Whatever is still mapped or reserved goes back, and the segments are freed, as the allocator's end
    // does, so that the parts go quietly (and LeakSanitizer sees nothing left).
    (void)expandable_->RepairQuarantinedChunks();
    std::vector<Segment*> segments;
    for (const auto& [base, segment] : host_.ledger) segments.push_back(segment);
    for (Segment* segment : segments) {
      if (segment->vmm != nullptr) {
        for (const auto& [ptr, chunk] : segment->vmm->chunks()) {
          (void)driver_->sim().MemUnmap(ptr, chunk.size);
          (void)driver_->sim().MemRelease(chunk.handle);
        }
        (void)driver_->sim().AddressFree(segment->base, segment->size);
      }
      host_.ledger.Forget(*segment);
      delete segment;
    }
    log_.at_exit = true;
    expandable_->ReleaseCachedHandlesAtExit();
  }

  absl::StatusOr<DevicePtr> Allocate(std::size_t bytes) {
    return expandable_->Allocate(*shard_, AllocationRequest(bytes, kDefaultStream, host_.config));
  }
  void Free(DevicePtr ptr) {
    SpinLockHolder lock(&shard_->mu);
    Block* b = shard_->allocated.Find(ptr);
    ASSERT_NE(b, nullptr);
    host_.blocks.Free(*shard_, b);
  }
  // A growth of one new 2 MiB chunk at `at` (MiB from the base) into a fresh or grown segment.
  std::vector<std::string> GrowthOfOneChunk(int at) {
    const std::string a = absl::StrCat("@", at);
    return {// planned under the shard's lock, the budget under the device lock too
            "lock shard", "best_fit", "planner 2M", "capture_underway", "lock device", "committed 0M 2M",
            "capacity", "over_limit 0M 2M", "begin_growth 0M", "unlock device", "unlock shard",
            // admitted under the device lock
            "lock device", "admit 0M 2M", "unlock device",
            // carried out with no lock
            "MemCreate 2M", "MemMap " + a + " 2M", "MemSetAccess " + a + " 2M", "observer map " + a + " 2M",
            // settled under the shard's lock and the device lock
            // (the plan took the hole in flight at exactly its size; the index merges it back)
            "lock shard", "lock device", "end_growth 2M", "chunk_mapped " + a + " 2M",
            "return_to_index " + a + " 2M mapped", "unlock device", "unlock shard",
            // the next pass serves the request
            "lock shard", "best_fit", "unlock shard"};
  }

  Log log_;
  RecordingHost host_{log_};
  MappingHooks hooks_{0};
  std::unique_ptr<LoggingDriver> driver_;
  std::unique_ptr<ExpandableSegments> expandable_;
  StreamShard* shard_ = nullptr;
};

TEST_F(ExpandableHostTest, TheFirstGrowthReservesWithNoLockThenListsTheSegmentUnderTheLocks) {
  ASSERT_OK_AND_ASSIGN(DevicePtr p, Allocate(2 * kMiB));
  EXPECT_EQ(p, log_.base);
  std::vector<std::string> expected = {
      // nothing to plan in: no segment
      "lock shard", "best_fit", "planner 2M", "unlock shard",
      // reserved with no lock, listed under the shard's lock and the device lock, in that order
      "AddressReserve @0", "lock shard", "lock device", "add_reservation @0", "unlock device",
      "unlock shard"};
  std::vector<std::string> growth = GrowthOfOneChunk(0);
  expected.insert(expected.end(), growth.begin(), growth.end());
  EXPECT_THAT(log_.Take(), ::testing::ElementsAreArray(expected));
}

TEST_F(ExpandableHostTest, GrowthMakesNoDriverCallWithALockHeld) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  // The second growth maps the next chunk: plan under the lock, driver calls unlocked, settle locked.
  ASSERT_OK_AND_ASSIGN(DevicePtr p, Allocate(2 * kMiB));
  EXPECT_EQ(p, log_.base + 2 * kMiB);
  EXPECT_THAT(log_.Take(), ::testing::ElementsAreArray(GrowthOfOneChunk(2)));
  EXPECT_EQ(driver_->sim().Counters().mappings, 2u);
}

TEST_F(ExpandableHostTest, AFailedAccessGrantIsUndoneAndItsHandleCached) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  ASSERT_OK_AND_ASSIGN(DevicePtr p, Allocate(2 * kMiB));
  EXPECT_EQ(p, 0u);  // no memory: the request goes on down the slow path
  EXPECT_THAT(log_.Take(),
              ElementsAre("lock shard", "best_fit", "planner 2M", "capture_underway", "lock device",
                          "committed 0M 2M", "capacity", "over_limit 0M 2M", "begin_growth 0M",
                          "unlock device", "unlock shard", "lock device", "admit 0M 2M", "unlock device",
                          "MemCreate 2M", "MemMap @2 2M", "MemSetAccess @2 2M",
                          // undone with no lock; no observer hears of it
                          "MemUnmap @2 2M",
                          // settled: nothing accounted, the range back unmapped, the handle cached
                          "lock shard", "lock device", "end_growth 2M", "return_to_index @2 2M unmapped",
                          "unlock device", "unlock shard"));
  EXPECT_EQ(driver_->sim().Counters().mappings, 1u);
  EXPECT_EQ(driver_->sim().Counters().handles, 2u);
  std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  PhysicalHandle cached{};
  EXPECT_TRUE(expandable_->TakeCachedHandle(nullptr, 2 * kMiB, &cached));
  expandable_->CacheHandle({0, 2 * kMiB, cached});
  EXPECT_EQ(host_.budget.growth_in_flight(), 0u);
  EXPECT_OK(expandable_->CheckInvariants(0));
}

TEST_F(ExpandableHostTest, AChunkTheDeviceWillNotUnmapIsQuarantinedThenRepaired) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  driver_->sim().InjectFault(SimCall::kMemUnmap, 1, DriverResult::kInvalidValue);
  ASSERT_OK_AND_ASSIGN(DevicePtr p, Allocate(2 * kMiB));
  EXPECT_EQ(p, 0u);
  std::vector<std::string> growth = log_.Take();
  ASSERT_EQ(growth.size(), 24u);
  // The access grant fails and so does the undo: the chunk stays mapped without access, accounted, a block
  // of its own that stays in flight (not returned to any index) and that no observer hears of.
  EXPECT_THAT(
      std::vector<std::string>(growth.begin() + 14, growth.end()),
      ElementsAre("MemCreate 2M", "MemMap @2 2M", "MemSetAccess @2 2M", "MemUnmap @2 2M", "lock shard",
                  "lock device", "end_growth 2M", "chunk_mapped @2 2M", "unlock device", "unlock shard"));
  {
    std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    EXPECT_FALSE(expandable_->Accessible(log_.base + 2 * kMiB));
  }
  log_.Take();

  ASSERT_OK(expandable_->RepairQuarantinedChunks());
  EXPECT_THAT(log_.Take(), ElementsAre(
                               // taken out of the quarantine under the device lock
                               "lock device", "unlock device",
                               // access granted with no lock, and only then told of
                               "MemSetAccess @2 2M", "observer map @2 2M",
                               // settled as a free mapped block
                               "lock shard", "lock device", "return_to_index @2 2M mapped", "unlock device",
                               "unlock shard"));
  // Served now from the repaired chunk, with no driver call.
  ASSERT_OK_AND_ASSIGN(p, Allocate(2 * kMiB));
  EXPECT_EQ(p, log_.base + 2 * kMiB);
  EXPECT_THAT(log_.Take(), ElementsAre("lock shard", "best_fit", "unlock shard"));
}

TEST_F(ExpandableHostTest, ARepairThatCannotGrantAccessUnmapsTheChunkAndCachesItsHandle) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  driver_->sim().InjectFault(SimCall::kMemUnmap, 1, DriverResult::kInvalidValue);
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  ASSERT_OK(expandable_->RepairQuarantinedChunks());
  EXPECT_THAT(log_.Take(), ElementsAre("lock device", "unlock device", "MemSetAccess @2 2M",
                                       // unmapped under the gate, once it is sure no capture is underway
                                       "enter gate", "capture_underway", "MemUnmap @2 2M", "leave gate",
                                       "lock shard", "lock device", "chunk_unmapped @2 2M",
                                       "return_to_index @2 2M unmapped", "unlock device", "unlock shard"));
  EXPECT_EQ(driver_->sim().Counters().mappings, 1u);
  std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
  EXPECT_TRUE(expandable_->Accessible(log_.base + 2 * kMiB));
  PhysicalHandle cached{};
  EXPECT_TRUE(expandable_->TakeCachedHandle(nullptr, 2 * kMiB, &cached));
  expandable_->CacheHandle({0, 2 * kMiB, cached});
}

// EmptyCache in one thread asks whether a capture is underway, then a capture begins in another before the
// repair unmaps: the repair asks again inside the gate, and the chunk stays quarantined until the capture
// has ended.
TEST_F(ExpandableHostTest, ARepairDoesNotUnmapWhileACaptureIsUnderway) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  driver_->sim().InjectFault(SimCall::kMemUnmap, 1, DriverResult::kInvalidValue);
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  const std::size_t mappings = driver_->sim().Counters().mappings;

  host_.capturing = true;
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  EXPECT_FALSE(expandable_->RepairQuarantinedChunks().ok());
  EXPECT_THAT(log_.Take(), ElementsAre("lock device", "unlock device", "MemSetAccess @2 2M", "enter gate",
                                       "capture_underway", "leave gate", "lock shard", "lock device",
                                       "unlock device", "unlock shard"));
  EXPECT_EQ(driver_->sim().Counters().mappings, mappings);
  {
    std::unique_ptr<ExpandableHost::Lock> lock = host_.LockDevice();
    EXPECT_FALSE(expandable_->Accessible(log_.base + 2 * kMiB));
  }

  // Once the capture has ended, the next repair unmaps it.
  host_.capturing = false;
  driver_->sim().InjectFault(SimCall::kMemSetAccess, 1, DriverResult::kOutOfMemory);
  ASSERT_OK(expandable_->RepairQuarantinedChunks());
  EXPECT_EQ(driver_->sim().Counters().mappings, mappings - 1);
}

TEST_F(ExpandableHostTest, AReleaseUnmapsOnlyWhollyFreeChunksAfterTheDeviceHasFinished) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  ASSERT_OK_AND_ASSIGN(DevicePtr second, Allocate(2 * kMiB));
  Free(second);
  log_.Take();
  ASSERT_OK_AND_ASSIGN(std::size_t unmapped, expandable_->Release(kDefaultPool));
  EXPECT_EQ(unmapped, 2 * kMiB);
  EXPECT_THAT(
      log_.Take(),
      ElementsAre(
          // the free chunk carved in flight with every shard locked (the first one is allocated)
          "lock all", "flush_quick_cache", "carve_range @2 2M", "unlock all",
          // unmapped under the gate, once the device has finished, with no other lock
          "enter gate", "wait device", "observer unmap @2 2M", "MemUnmap @2 2M", "leave gate", "MemRelease",
          // settled with every shard locked; the reservation stays (a chunk is mapped)
          "lock all", "chunk_unmapped @2 2M", "return_to_index @2 2M unmapped", "segments", "unlock all"));
  EXPECT_EQ(driver_->sim().Counters().mappings, 1u);
  EXPECT_EQ(driver_->sim().Counters().handles, 1u);
}

TEST_F(ExpandableHostTest, AReleaseOfNothingFreeStillPassesTheGateButWaitsForNothing) {
  ASSERT_OK(Allocate(2 * kMiB).status());
  log_.Take();
  ASSERT_OK_AND_ASSIGN(std::size_t unmapped, expandable_->Release(kDefaultPool));
  EXPECT_EQ(unmapped, 0u);
  EXPECT_THAT(log_.Take(), ElementsAre("lock all", "flush_quick_cache", "unlock all", "enter gate",
                                       "leave gate", "lock all", "segments", "unlock all"));
  EXPECT_THAT(log_.entries, IsEmpty());
}

}  // namespace
}  // namespace graphalloc
