// The pool restorer driven through a fake RestoreHost (restore_host.h), without an allocator: which
// operations each phase asks for, in which order, and that every operation the interface documents as
// needing the pool's lock is asked for while exactly one PoolLock is alive, and every other one (the driver,
// the observers, the gate, the quarantine repair) while none is. The restores of real pools are
// pool_restorer_test and pool_checkpoint_test.
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "graphalloc/allocator/core/pool_restorer.h"
#include "graphalloc/allocator/core/restore_host.h"
#include "gtest/gtest.h"
#include "tests/testing/status_macros.h"

namespace graphalloc {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A pool with no segment: every lookup finds nothing, and an operation on a block or a chunk fails the test
// (a restore of an empty or refused checkpoint must not reach one).
class FakeRestoreHost final : public RestoreHost {
 public:
  // What each call was, in order; "lock" and "unlock" where a PoolLock came and went.
  mutable std::vector<std::string> log;
  absl::Status quiet = absl::OkStatus();

  std::unique_ptr<PoolLock> LockPool(PoolId /*pool*/) override {
    EXPECT_EQ(locks_, 0) << "a PoolLock taken with one held";
    return std::make_unique<Lock>(*this);
  }
  void WithUnmapGate(absl::FunctionRef<void(bool device_idle)> unmaps) override {
    Unlocked("gate");
    unmaps(true);
  }

  absl::Status CheckQuiet(const PoolLock& /*lock*/) const override {
    Locked("check_quiet");
    return quiet;
  }
  std::vector<Segment*> SegmentsOf(const PoolLock& /*lock*/) const override {
    Locked("segments_of");
    return {};
  }
  Segment* FindSegment(const PoolLock& /*lock*/, DevicePtr /*base*/) const override {
    Locked("find_segment");
    return nullptr;
  }

  void FlushQuickCaches(const PoolLock& /*lock*/) override { Locked("flush_quick_caches"); }
  Block* SplitOff(const PoolLock&, StreamShard&, Block*, DevicePtr) override { return Unexpected<Block*>(); }
  Block* CarveRange(const PoolLock&, StreamShard&, Block*, DevicePtr, DevicePtr) override {
    return Unexpected<Block*>();
  }
  stat_events::BlockFigures FiguresOf(const Block*, bool) const override {
    return Unexpected<stat_events::BlockFigures>();
  }

  std::size_t Granularity() const override {
    log.push_back("granularity");
    return kGranularity;
  }
  absl::Status RepairQuarantinedChunks() override {
    Unlocked("repair_quarantined");
    return absl::OkStatus();
  }
  std::vector<int> Peers(const PoolLock& /*lock*/) const override {
    Locked("peers");
    return {};
  }
  absl::StatusOr<PhysicalHandle> CreateHandle(const PoolState*, std::size_t) override {
    return Unexpected<PhysicalHandle>();
  }
  absl::Status MapChunk(const ChunkPlacement&, const std::vector<int>&,
                        std::vector<ChunkPlacement>*) override {
    return Unexpected<absl::Status>();
  }
  absl::Status UnmapChunk(const ChunkPlacement&) override { return Unexpected<absl::Status>(); }
  absl::Status ReleaseHandle(PhysicalHandle) override { return Unexpected<absl::Status>(); }
  void CacheHandle(const PoolLock&, const ChunkPlacement&) override { Unexpected<int>(); }
  void LockAndCacheHandle(const ChunkPlacement&) override { Unexpected<int>(); }
  bool MustStayMapped(const Segment&, DevicePtr, DevicePtr) const override { return Unexpected<bool>(); }
  void ReportMapped(const Segment&, const ChunkPlacement&) override { Unexpected<int>(); }
  void ReportUnmapped(const Segment&, const ChunkPlacement&) override { Unexpected<int>(); }
  void SettleInFlight(const PoolLock&, StreamShard&, Block*, const ChunkPlacement&, bool, bool) override {
    Unexpected<int>();
  }
  void AccountMapped(const PoolLock&, Segment*, const ChunkPlacement&) override { Unexpected<int>(); }
  void AccountUnmapped(const PoolLock&, Segment*, const ChunkPlacement&) override { Unexpected<int>(); }

  void RecordFreed(DevicePtr, std::size_t, Stream) override { Unexpected<int>(); }
  void RecordAllocated(DevicePtr, std::size_t, Stream) override { Unexpected<int>(); }

  static constexpr std::size_t kGranularity = 2u << 20;

 private:
  class Lock final : public PoolLock {
   public:
    explicit Lock(FakeRestoreHost& host) : host_(host) {
      ++host_.locks_;
      host_.log.push_back("lock");
    }
    ~Lock() override {
      --host_.locks_;
      host_.log.push_back("unlock");
    }
    bool Holds(const StreamShard* /*shard*/) const override { return false; }

   private:
    FakeRestoreHost& host_;
  };

  void Locked(const char* what) const {
    EXPECT_EQ(locks_, 1) << what << " needs the pool's lock";
    log.push_back(what);
  }
  void Unlocked(const char* what) const {
    EXPECT_EQ(locks_, 0) << what << " must be called with no lock held";
    log.push_back(what);
  }
  template <typename T>
  T Unexpected() const {
    ADD_FAILURE() << "the restore reached a block or a chunk of a pool that has none";
    return T{};
  }

  int locks_ = 0;
};

// One regular segment of one free 2 MiB block.
CheckpointSegment OneFreeSegment() {
  return CheckpointSegment{
      .base = 0x100000000,
      .size = 2u << 20,
      .stream = kDefaultStream,
      .small = false,
      .expandable = false,
      .blocks = {CheckpointBlock{
          .offset = 0, .size = 2u << 20, .allocated = false, .mapped = true, .requested_size = 0}}};
}

TEST(PoolRestorerHostTest, AnEmptyCheckpointOfAnEmptyPoolTakesThePoolLockOncePerLockedStep) {
  FakeRestoreHost host;
  const PoolCheckpoint checkpoint{.pool = 1, .allocator_id = 1, .segments = {}};
  PoolRestorer restorer(host, 1, checkpoint);
  ASSERT_OK_AND_ASSIGN(RestoreResult result, restorer.Run());
  EXPECT_TRUE(result.freed.empty());
  EXPECT_TRUE(result.created.empty());
  EXPECT_EQ(result.bytes_left_mapped, 0u);
  EXPECT_THAT(host.log, ElementsAre("repair_quarantined",
                                    // phase 1: plan (with the validation), then settle
                                    "lock", "check_quiet", "segments_of", "peers", "unlock", "lock", "unlock",
                                    // phase 2, with phase 3's plan (nothing to unmap: no phase 3)
                                    "lock", "check_quiet", "segments_of", "flush_quick_caches", "segments_of",
                                    "unlock"));
}

TEST(PoolRestorerHostTest, AMalformedCheckpointIsRefusedBeforeAnyLock) {
  FakeRestoreHost host;
  PoolCheckpoint checkpoint{.pool = 1, .allocator_id = 1, .segments = {OneFreeSegment()}};
  checkpoint.segments[0].blocks[0].size = 1u << 20;  // no longer covers the segment
  PoolRestorer restorer(host, 1, checkpoint);
  const absl::StatusOr<RestoreResult> result = restorer.Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("malformed"));
  EXPECT_THAT(host.log, ElementsAre("granularity"));
}

TEST(PoolRestorerHostTest, ABusyPoolIsRefusedUnderThePoolLockWithNothingChanged) {
  FakeRestoreHost host;
  host.quiet = absl::FailedPreconditionError("pool 1 is busy");
  const PoolCheckpoint checkpoint{.pool = 1, .allocator_id = 1, .segments = {OneFreeSegment()}};
  PoolRestorer restorer(host, 1, checkpoint);
  EXPECT_EQ(restorer.Run().status(), host.quiet);
  EXPECT_THAT(host.log, ElementsAre("granularity", "repair_quarantined", "lock", "check_quiet", "unlock"));
}

TEST(PoolRestorerHostTest, ASegmentNoLongerInThePoolIsRefused) {
  FakeRestoreHost host;
  const PoolCheckpoint checkpoint{.pool = 1, .allocator_id = 1, .segments = {OneFreeSegment()}};
  PoolRestorer restorer(host, 1, checkpoint);
  const absl::StatusOr<RestoreResult> result = restorer.Run();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("is no longer in pool 1"));
  EXPECT_THAT(host.log, ElementsAre("granularity", "repair_quarantined", "lock", "check_quiet",
                                    "find_segment", "unlock"));
}

}  // namespace
}  // namespace graphalloc
