// Sleep and wake driven through a fake SleepHost (sleep_host.h), without an allocator: which operations each
// phase asks for, in which order, and that every operation the interface documents as needing a lock is
// asked for while that lock is alive, and every driver, copy and observer call while neither the device lock
// nor the shards' lock is (the capture gate, held from a call's first step to its last, excepted). The sleeps
// and wakes of real pools are sleep_wake_test and c_api_sleep_test.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/pool_sleep.h"
#include "graphalloc/allocator/core/segment_ledger.h"
#include "graphalloc/allocator/core/sleep_host.h"
#include "graphalloc/allocator/core/stream_shard.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr DevicePtr kBase = 0x10000000;
constexpr DevicePtr kSecondChunk = kBase + 2 * kMiB;

// The default pool's one expandable segment of 4 MiB, two 2 MiB chunks mapped (handles 1 and 2): an
// allocated block of 1 MiB at its base, the rest free. Owned by the test; the fake lends it.
struct DefaultPoolSegment {
  DefaultPoolSegment() {
    segment.base = kBase;
    segment.size = 4 * kMiB;
    segment.shard = &shard;
    segment.expandable = true;
    segment.vmm = std::make_unique<ExpandableSegment>(kBase, 4 * kMiB);
    segment.vmm->AddChunk({kBase, 2 * kMiB, PhysicalHandle{1}});
    segment.vmm->AddChunk({kSecondChunk, 2 * kMiB, PhysicalHandle{2}});
    live.ptr = kBase;
    live.size = kMiB;
    live.allocated = true;
    live.segment = &segment;
    live.next = &rest;
    rest.ptr = kBase + kMiB;
    rest.size = 3 * kMiB;
    rest.segment = &segment;
    rest.prev = &live;
    segment.head = &live;
  }

  StreamShard shard{kDefaultStream, nullptr};
  Segment segment;
  Block live;
  Block rest;
};

// A host with the default pool (its segments lent by the test) and a private pool 5 tagged "trainer", no
// segment of it. What the driver does is scripted: every call succeeds but the map `fail_map` names.
class FakeSleepHost final : public SleepHost {
 public:
  // What each call was, in order; "lock X" and "unlock X" where a lock came and went.
  mutable std::vector<std::string> log;
  std::vector<Segment*> default_segments;
  std::map<PoolId, std::string> private_pools{{5, "trainer"}};
  // The 1-based MapChunk call that fails (0: none).
  int fail_map = 0;

  std::unique_ptr<GateLock> LockCaptureGate() override {
    EXPECT_EQ(gate_ + device_ + shards_, 0) << "the gate taken with a lock held";
    return std::make_unique<Counted<GateLock>>(log, "gate", std::vector<int*>{&gate_});
  }
  std::unique_ptr<DeviceLock> LockDevice() override {
    EXPECT_EQ(device_, 0) << "the device lock taken with it held";
    return std::make_unique<Counted<DeviceLock>>(log, "device", std::vector<int*>{&device_});
  }
  std::unique_ptr<ShardsLock> LockAllShards() override {
    EXPECT_EQ(device_, 0) << "the shards locked with the device lock held";
    // A ShardsLock holds the device lock too.
    return std::make_unique<Counted<ShardsLock>>(log, "shards", std::vector<int*>{&shards_, &device_});
  }

  bool CaptureUnderway(const GateLock& /*gate*/) const override {
    Gated("capture_underway");
    return false;
  }
  absl::Status WaitForDevice(const GateLock& /*gate*/) override {
    Gated("wait_for_device");
    return absl::OkStatus();
  }

  std::vector<Pool> PrivatePools(const DeviceLock& /*lock*/) const override {
    DeviceLocked("private_pools");
    std::vector<Pool> out;
    for (const auto& [id, tag] : private_pools) out.push_back({id, tag});
    return out;
  }
  std::optional<std::string> PoolTag(const DeviceLock& /*lock*/, PoolId id) const override {
    DeviceLocked(absl::StrFormat("pool_tag %d", id));
    auto it = private_pools.find(id);
    if (it == private_pools.end()) return std::nullopt;
    return it->second;
  }
  std::vector<Segment*> SegmentsOf(const DeviceLock& /*lock*/, PoolId pool) const override {
    DeviceLocked(absl::StrFormat("segments_of %d", pool));
    return pool == kDefaultPool ? default_segments : std::vector<Segment*>{};
  }
  Segment* SegmentContaining(const DeviceLock& /*lock*/, DevicePtr ptr) const override {
    DeviceLocked(absl::StrFormat("segment_containing %#x", ptr));
    for (Segment* s : default_segments) {
      if (ptr >= s->base && ptr < s->base + s->size) return s;
    }
    return nullptr;
  }

  void FlushQuickCaches(const ShardsLock& /*lock*/, const std::vector<PoolId>& pools) override {
    ShardsLocked(absl::StrFormat("flush_quick_caches %d", pools.size()));
  }
  void Unlink(const ShardsLock&, Segment*) override { ADD_FAILURE() << "no regular segment to unlink"; }
  void Link(const ShardsLock&, Segment*) override { ADD_FAILURE() << "no regular segment to link"; }
  absl::Status ReleaseSegments(std::vector<Segment*>) override {
    ADD_FAILURE() << "no regular segment to release";
    return absl::OkStatus();
  }

  bool MustStayMapped(const Segment& /*segment*/, DevicePtr begin, DevicePtr /*end*/) const override {
    log.push_back(absl::StrFormat("must_stay_mapped %#x", begin));
    return false;
  }
  std::vector<int> Peers(const DeviceLock& /*lock*/) const override {
    DeviceLocked("peers");
    return {};
  }
  bool TakeCachedHandle(const DeviceLock& /*lock*/, const Segment& /*segment*/, std::size_t /*size*/,
                        PhysicalHandle* /*handle*/) override {
    DeviceLocked("take_cached_handle");
    return false;
  }
  void CacheHandle(const DeviceLock& /*lock*/, const ChunkPlacement& chunk) override {
    DeviceLocked(absl::StrFormat("cache_handle %d", static_cast<int>(chunk.handle)));
  }
  absl::StatusOr<PhysicalHandle> CreateHandle(const Segment& /*segment*/, std::size_t /*size*/) override {
    const PhysicalHandle handle{next_handle_++};
    Unlocked(absl::StrFormat("create_handle %d", static_cast<int>(handle)));
    return handle;
  }
  absl::Status MapChunk(const ChunkPlacement& chunk) override {
    Unlocked(absl::StrFormat("map %#x %d", chunk.ptr, static_cast<int>(chunk.handle)));
    if (++maps_ == fail_map) return absl::ResourceExhaustedError("cuMemMap failed: out of memory");
    return absl::OkStatus();
  }
  absl::Status SetAccess(const ChunkPlacement& chunk, const std::vector<int>& /*peers*/) override {
    Unlocked(absl::StrFormat("set_access %#x", chunk.ptr));
    return absl::OkStatus();
  }
  absl::Status UnmapChunk(const ChunkPlacement& chunk) override {
    Unlocked(absl::StrFormat("unmap %#x", chunk.ptr));
    return absl::OkStatus();
  }
  absl::Status ReleaseHandle(PhysicalHandle handle) override {
    Unlocked(absl::StrFormat("release_handle %d", static_cast<int>(handle)));
    return absl::OkStatus();
  }
  void ReportMapped(const Segment& /*segment*/, const ChunkPlacement& chunk) override {
    Unlocked(absl::StrFormat("report_mapped %#x", chunk.ptr));
  }
  void ReportUnmapped(const Segment& /*segment*/, const ChunkPlacement& chunk) override {
    Unlocked(absl::StrFormat("report_unmapped %#x", chunk.ptr));
  }
  // As the ledger does: the chunk map follows (SegmentLedger::ChunkAsleep / ChunkAwake).
  void AccountAsleep(const ShardsLock& /*lock*/, Segment* segment, const ChunkPlacement& chunk) override {
    ShardsLocked(absl::StrFormat("account_asleep %#x", chunk.ptr));
    segment->vmm->ChunkAsleep(chunk.ptr);
  }
  void AccountAwake(const ShardsLock& /*lock*/, Segment* segment, const ChunkPlacement& chunk) override {
    ShardsLocked(absl::StrFormat("account_awake %#x %d", chunk.ptr, static_cast<int>(chunk.handle)));
    segment->vmm->ChunkAwake(chunk);
  }

  absl::StatusOr<void*> HostAlloc(std::size_t size) override {
    Unlocked(absl::StrFormat("host_alloc %d", size));
    pinned_.push_back(std::make_unique<char[]>(size));
    return static_cast<void*>(pinned_.back().get());
  }
  absl::Status HostFree(void* /*host*/) override {
    Unlocked("host_free");
    return absl::OkStatus();
  }
  absl::Status CopyAsync(DevicePtr dst, DevicePtr src, std::size_t size) override {
    // Named by the device side: the pinned side's address is the fake's.
    const bool to_host = src >= kBase && src < kBase + 4 * kMiB;
    Unlocked(to_host ? absl::StrFormat("copy_to_host %#x %d", src, size)
                     : absl::StrFormat("copy_to_device %#x %d", dst, size));
    return absl::OkStatus();
  }
  absl::Status SynchronizeCopies() override {
    Unlocked("synchronize_copies");
    return absl::OkStatus();
  }

 private:
  // A lock that logs its coming and going and counts itself in `counters` while alive.
  template <typename Lock>
  class Counted final : public Lock {
   public:
    Counted(std::vector<std::string>& log, std::string name, std::vector<int*> counters)
        : log_(log), name_(std::move(name)), counters_(std::move(counters)) {
      for (int* c : counters_) ++*c;
      log_.push_back("lock " + name_);
    }
    ~Counted() override {
      for (int* c : counters_) --*c;
      log_.push_back("unlock " + name_);
    }

   private:
    std::vector<std::string>& log_;
    const std::string name_;
    const std::vector<int*> counters_;
  };

  void Gated(const std::string& what) const {
    EXPECT_EQ(gate_, 1) << what << " needs the capture gate";
    EXPECT_EQ(device_, 0) << what << " must be called with no other lock held";
    log.push_back(what);
  }
  void DeviceLocked(const std::string& what) const {
    EXPECT_EQ(device_, 1) << what << " needs the device lock";
    log.push_back(what);
  }
  void ShardsLocked(const std::string& what) const {
    EXPECT_EQ(shards_, 1) << what << " needs every shard's lock";
    log.push_back(what);
  }
  void Unlocked(const std::string& what) const {
    EXPECT_EQ(device_, 0) << what << " must be called with no lock held but the gate";
    log.push_back(what);
  }

  int gate_ = 0;
  int device_ = 0;
  int shards_ = 0;
  int maps_ = 0;
  std::uint64_t next_handle_ = 10;
  std::vector<std::unique_ptr<char[]>> pinned_;
};

class PoolSleepHostTest : public ::testing::Test {
 protected:
  PoolSleepHostTest() { host_.default_segments = {&pool_.segment}; }

  // A discard sleep of the default pool, its log forgotten: what a wake starts from.
  void SleepDefaultPool() {
    SleepRequest request;
    request.scope = SleepScope::Pool(kDefaultPool);
    ASSERT_OK(sleep_.Sleep(request).status());
    host_.log.clear();
  }

  DefaultPoolSegment pool_;
  FakeSleepHost host_;
  PoolSleep sleep_{host_};
};

TEST_F(PoolSleepHostTest, ADiscardSleepChecksUnderTheShardsLockThenUnmapsEachChunkWithNoLock) {
  SleepRequest request;
  request.scope = SleepScope::Pool(kDefaultPool);
  ASSERT_OK_AND_ASSIGN(SleepResult result, sleep_.Sleep(request));
  EXPECT_EQ(result.bytes_released, 4 * kMiB);
  EXPECT_EQ(result.bytes_backed_up, 0u);
  EXPECT_THAT(result.pools, ElementsAre(kDefaultPool));
  EXPECT_TRUE(sleep_.IsAsleep(kDefaultPool));
  EXPECT_TRUE(pool_.segment.vmm->asleep());
  EXPECT_EQ(pool_.segment.vmm->sleeping_bytes(), 4 * kMiB);
  EXPECT_THAT(host_.log,
              ElementsAre("lock gate", "capture_underway",
                          // resolve (the default pool: no registry lookup)
                          "lock device", "unlock device",
                          // prepare: wait, then check and take out (nothing regular), then mark
                          "wait_for_device", "lock shards", "flush_quick_caches 1", "segments_of 0",
                          "must_stay_mapped 0x10000000", "must_stay_mapped 0x10200000", "segments_of 0",
                          "unlock shards", "lock shards", "segments_of 0", "unlock shards",
                          // unmap and release, observers told first
                          "report_unmapped 0x10000000", "unmap 0x10000000", "release_handle 1",
                          "report_unmapped 0x10200000", "unmap 0x10200000", "release_handle 2",
                          // settle
                          "lock shards", "account_asleep 0x10000000", "account_asleep 0x10200000",
                          "unlock shards", "unlock gate"));
}

TEST_F(PoolSleepHostTest, ABackedUpSleepCopiesTheLiveBlocksToPinnedMemoryBeforeAnyUnmap) {
  SleepRequest request;
  request.scope = SleepScope::Pool(kDefaultPool);
  request.mode = SleepMode::kBackup;
  ASSERT_OK_AND_ASSIGN(SleepResult result, sleep_.Sleep(request));
  EXPECT_EQ(result.bytes_released, 4 * kMiB);
  EXPECT_EQ(result.bytes_backed_up, kMiB);
  EXPECT_THAT(result.pools, ElementsAre(kDefaultPool));
  EXPECT_THAT(
      host_.log,
      ElementsAre("lock gate", "capture_underway", "lock device", "unlock device", "wait_for_device",
                  "lock shards", "flush_quick_caches 1", "segments_of 0", "must_stay_mapped 0x10000000",
                  "must_stay_mapped 0x10200000", "segments_of 0", "unlock shards", "lock shards",
                  "segments_of 0", "unlock shards",
                  // back up: no buffer kept by an earlier wake (looked up under the device lock), so
                  // one is pinned; the one live block copied, and landed before any unmap
                  "lock device", "unlock device", "host_alloc 1048576", "copy_to_host 0x10000000 1048576",
                  "synchronize_copies",
                  // unmap, release, settle
                  "report_unmapped 0x10000000", "unmap 0x10000000", "release_handle 1",
                  "report_unmapped 0x10200000", "unmap 0x10200000", "release_handle 2", "lock shards",
                  "account_asleep 0x10000000", "account_asleep 0x10200000", "unlock shards", "unlock gate"));
  // PoolStats' figures: the sleeping address space as the lent ledger's segments say, the pinned backup.
  HistoryRing history;
  SegmentLedger ledger(~std::size_t{0}, history, 0);
  ledger.AddReservation(&pool_.segment);
  const SleepState state = sleep_.StateOf(kDefaultPool, ledger);
  ledger.RemoveReservation(&pool_.segment);
  EXPECT_TRUE(state.asleep);
  EXPECT_EQ(state.sleeping_bytes, 4 * kMiB);
  EXPECT_EQ(state.backup_bytes, kMiB);
}

TEST_F(PoolSleepHostTest, WakeWhoseMapFailsUndoesItsMapsAndStaysAsleep) {
  SleepDefaultPool();
  host_.fail_map = 2;
  const absl::StatusOr<WakeResult> result = sleep_.Wake(WakeRequest{});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("Wake: the pools stay asleep, their backups kept: cuMemMap failed"));
  EXPECT_THAT(host_.log, ElementsAre("lock gate", "capture_underway",
                                     // plan: resolve every pool (the private one is awake), no cached handle
                                     "lock shards", "private_pools", "segments_of 0", "take_cached_handle",
                                     "take_cached_handle", "unlock shards",
                                     // map: the first chunk maps, the second does not
                                     "lock device", "peers", "unlock device", "create_handle 10",
                                     "map 0x10000000 10", "create_handle 11", "map 0x10200000 11",
                                     // undo: what this wake mapped is unmapped (observers never told of it),
                                     // and every handle it created goes back
                                     "unmap 0x10000000", "release_handle 10", "release_handle 11",
                                     // settle: nothing accounted
                                     "lock shards", "unlock shards", "unlock gate"));
  EXPECT_TRUE(sleep_.IsAsleep(kDefaultPool));
  EXPECT_TRUE(pool_.segment.vmm->asleep());
  EXPECT_TRUE(pool_.segment.vmm->chunks().empty());
  EXPECT_EQ(pool_.segment.vmm->sleeping_bytes(), 4 * kMiB);
  for (const auto& [ptr, chunk] : pool_.segment.vmm->sleeping_chunks()) EXPECT_FALSE(chunk.mapped) << ptr;

  // The next wake starts from scratch and wakes the pool.
  host_.log.clear();
  host_.fail_map = 0;
  ASSERT_OK_AND_ASSIGN(WakeResult woken, sleep_.Wake(WakeRequest{}));
  EXPECT_EQ(woken.bytes_mapped, 4 * kMiB);
  EXPECT_THAT(woken.pools, ElementsAre(kDefaultPool));
  EXPECT_FALSE(sleep_.IsAsleep(kDefaultPool));
  EXPECT_THAT(host_.log,
              ElementsAre("lock gate", "capture_underway", "lock shards", "private_pools", "segments_of 0",
                          "take_cached_handle", "take_cached_handle", "unlock shards", "lock device", "peers",
                          "unlock device", "create_handle 12", "map 0x10000000 12", "create_handle 13",
                          "map 0x10200000 13", "set_access 0x10000000", "set_access 0x10200000",
                          "report_mapped 0x10000000", "report_mapped 0x10200000", "lock shards",
                          "account_awake 0x10000000 12", "account_awake 0x10200000 13", "segments_of 0",
                          "unlock shards", "unlock gate"));
}

TEST_F(PoolSleepHostTest, AnUnknownPoolOrTagIsNotFoundBeforeAnyChange) {
  SleepRequest by_id;
  by_id.scope = SleepScope::Pool(7);
  const absl::StatusOr<SleepResult> slept = sleep_.Sleep(by_id);
  EXPECT_EQ(slept.status(), absl::NotFoundError("private pool 7 does not exist"));
  EXPECT_THAT(host_.log, ElementsAre("lock gate", "capture_underway", "lock device", "pool_tag 7",
                                     "unlock device", "unlock gate"));

  host_.log.clear();
  SleepRequest by_tag;
  by_tag.scope = SleepScope::Tag("inference");
  EXPECT_EQ(sleep_.Sleep(by_tag).status(), absl::NotFoundError("no pool has the tag 'inference'"));
  EXPECT_THAT(host_.log, ElementsAre("lock gate", "capture_underway", "lock device", "private_pools",
                                     "unlock device", "unlock gate"));

  host_.log.clear();
  WakeRequest wake;
  wake.scope = SleepScope::Pool(7);
  EXPECT_EQ(sleep_.Wake(wake).status(), absl::NotFoundError("private pool 7 does not exist"));
  EXPECT_THAT(host_.log, ElementsAre("lock gate", "capture_underway", "lock shards", "pool_tag 7",
                                     "unlock shards", "unlock gate"));
  EXPECT_FALSE(sleep_.any_asleep());
  EXPECT_EQ(pool_.segment.vmm->chunks().size(), 2u);
}

TEST_F(PoolSleepHostTest, ABusyPoolIsRefusedWithNothingChanged) {
  pool_.rest.in_flight = true;  // a growth or a release of another thread is under way in it
  SleepRequest request;
  request.scope = SleepScope::Pool(kDefaultPool);
  const absl::StatusOr<SleepResult> result = sleep_.Sleep(request);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("block 0x10100000 of the default pool is being changed by another thread"));
  EXPECT_THAT(host_.log,
              ElementsAre("lock gate", "capture_underway", "lock device", "unlock device", "wait_for_device",
                          "lock shards", "flush_quick_caches 1", "segments_of 0", "unlock shards",
                          // abandoned: no segment was marked, the pool allocates again
                          "lock shards", "unlock shards", "unlock gate"));
  EXPECT_FALSE(sleep_.IsAsleep(kDefaultPool));
  EXPECT_FALSE(pool_.segment.vmm->asleep());
  EXPECT_EQ(pool_.segment.vmm->chunks().size(), 2u);
  EXPECT_TRUE(pool_.segment.vmm->sleeping_chunks().empty());
}

}  // namespace
}  // namespace graphalloc
