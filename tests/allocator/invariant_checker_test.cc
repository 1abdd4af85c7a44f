// The invariant checker on a hand-made allocator state: a consistent one passes, and each kind of damage
// (a broken chain link, a free block missing from the index, a pointer-map entry of a free block that is not
// parked, block or segment statistics that disagree with the blocks, a pool's reserved bytes, a
// handle-aligned segment's block across two chunks) is reported in its own words.
#include "graphalloc/allocator/core/invariant_checker.h"

#include <memory>
#include <string>

#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/core/allocator_expandable_host.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

class InvariantCheckerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<SimDriver>> driver = SimDriver::Create();
    ASSERT_TRUE(driver.ok()) << driver.status();
    driver_ = std::move(*driver);
    captures_ = std::make_unique<CaptureTracker>(*driver_);
    budget_ = std::make_unique<MemoryBudget>(driver_->Info().total_memory);
    host_ = std::make_unique<AllocatorExpandableHost>(
        AllocatorExpandableHost::Parts{shards_, blocks_, device_mu_, ledger_, *budget_, *captures_});
    expandable_ = std::make_unique<ExpandableSegments>(ExpandableSegments::Parts{*host_, *driver_, hooks_});
    MutexLock lock(&shards_.set_mu());
    shard_ = shards_.Add(kDefaultPool, kDefaultStream, nullptr);
  }
  void TearDown() override {
    MutexLock lock(&device_mu_);
    for (const std::unique_ptr<Segment>& s : segments_) {
      if (s->expandable) {
        ledger_.RemoveReservation(s.get());
      } else {
        ledger_.Unlink(s.get());
      }
    }
  }

  // An expandable large-pool segment of 8 granules: two chunks of one granule each mapped at its start,
  // holding one free block each, and the unmapped rest.
  Segment* AddTwoChunkSegment(DevicePtr base, bool handle_aligned) {
    const std::size_t gran = driver_->Info().granularity;
    segments_.push_back(std::make_unique<Segment>());
    Segment* s = segments_.back().get();
    s->base = base;
    s->size = 8 * gran;
    s->stream = kDefaultStream;
    s->shard = shard_;
    s->pool = &shard_->large_pool;
    s->expandable = true;
    s->handle_aligned = handle_aligned;
    s->vmm = std::make_unique<ExpandableSegment>(base, s->size);
    SpinLockHolder shard_lock(&shard_->mu);
    Block* head = shard_->arena.New();
    head->ptr = base;
    head->size = s->size;
    head->segment = s;
    s->head = head;
    Block* second = blocks_.SplitOff(*shard_, head, base + gran);
    Block* rest = blocks_.SplitOff(*shard_, second, base + 2 * gran);
    rest->mapped = false;
    shard_->large_pool.Insert(head);
    shard_->large_pool.Insert(second);
    shard_->large_pool.unmapped.emplace(rest->ptr, rest);
    MutexLock lock(&device_mu_);
    ledger_.AddReservation(s);
    ledger_.ChunkMapped(s, {base, gran, PhysicalHandle{}});
    ledger_.ChunkMapped(s, {base + gran, gran, PhysicalHandle{}});
    return s;
  }

  // A regular small-pool segment of one free block, as the allocator would leave it.
  Segment* AddFreeSegment(DevicePtr base, std::size_t size) {
    segments_.push_back(std::make_unique<Segment>());
    Segment* s = segments_.back().get();
    s->base = base;
    s->size = size;
    s->stream = kDefaultStream;
    s->shard = shard_;
    s->pool = &shard_->small_pool;
    SpinLockHolder shard_lock(&shard_->mu);
    Block* head = shard_->arena.New();
    head->ptr = base;
    head->size = size;
    head->segment = s;
    s->head = head;
    shard_->small_pool.Insert(head);
    MutexLock lock(&device_mu_);
    ledger_.Link(s);
    return s;
  }

  absl::Status Check() {
    AllShardsLock lock(shards_, device_mu_);
    return InvariantChecker(
               {lock, ledger_, pools_, *expandable_, config_.max_split_size, driver_->Info().granularity})
        .Run();
  }
  void ExpectViolation(const std::string& words) {
    absl::Status s = Check();
    EXPECT_TRUE(absl::IsInternal(s)) << s;
    EXPECT_NE(s.message().find("allocator invariant violated: " + words), std::string::npos) << s.message();
  }

  Config config_;
  HistoryRing history_;
  BlockCache blocks_{config_, history_};
  ShardTable shards_;
  Mutex device_mu_;
  SegmentLedger ledger_{config_.max_split_size, history_, /*device=*/0};
  PoolRegistry pools_;
  MappingHooks hooks_{0};
  std::unique_ptr<SimDriver> driver_;
  std::unique_ptr<CaptureTracker> captures_;
  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<AllocatorExpandableHost> host_;
  std::unique_ptr<ExpandableSegments> expandable_;
  StreamShard* shard_ = nullptr;
  std::vector<std::unique_ptr<Segment>> segments_;
};

TEST_F(InvariantCheckerTest, AConsistentStatePasses) {
  AddFreeSegment(0x200000, 2 * kMiB);
  AddFreeSegment(0x400000, 2 * kMiB);
  EXPECT_TRUE(Check().ok()) << Check();
}

TEST_F(InvariantCheckerTest, ABrokenChainLink) {
  Segment* s = AddFreeSegment(0x200000, 2 * kMiB);
  Block* rest = nullptr;
  {
    SpinLockHolder lock(&shard_->mu);
    shard_->small_pool.Erase(s->head);
    rest = blocks_.SplitOff(*shard_, s->head, s->base + kMiB);
    shard_->small_pool.Insert(s->head);
    shard_->small_pool.Insert(rest);
    rest->prev = nullptr;
  }
  ExpectViolation("block 0x300000 has a broken prev link");
}

TEST_F(InvariantCheckerTest, AFreeBlockMissingFromTheIndex) {
  Segment* s = AddFreeSegment(0x200000, 2 * kMiB);
  {
    SpinLockHolder lock(&shard_->mu);
    shard_->small_pool.Erase(s->head);
  }
  ExpectViolation("free block 0x200000 must be in exactly one of the free index and the quick cache");
}

TEST_F(InvariantCheckerTest, AParkedBlockMayKeepItsPointerMapEntry) {
  Segment* s = AddFreeSegment(0x200000, 2 * kMiB);
  {
    SpinLockHolder lock(&shard_->mu);
    shard_->small_pool.Erase(s->head);
    ASSERT_TRUE(shard_->quick.Push(s->head, &shard_->small_pool));
    shard_->AddToPointerMap(s->head);
  }
  EXPECT_TRUE(Check().ok()) << Check();
}

TEST_F(InvariantCheckerTest, AnIndexedFreeBlockInThePointerMap) {
  Segment* s = AddFreeSegment(0x200000, 2 * kMiB);
  {
    SpinLockHolder lock(&shard_->mu);
    shard_->AddToPointerMap(s->head);
  }
  ExpectViolation("free block 0x200000 is in the pointer map");
}

TEST_F(InvariantCheckerTest, APointerMapFlagThatDisagreesWithTheMap) {
  Segment* s = AddFreeSegment(0x200000, 2 * kMiB);
  {
    SpinLockHolder lock(&shard_->mu);
    s->head->in_pointer_map = true;
  }
  ExpectViolation("block 0x200000's pointer-map flag disagrees with the map");
}

TEST_F(InvariantCheckerTest, BlockStatisticsThatDisagreeWithTheBlocks) {
  AddFreeSegment(0x200000, 2 * kMiB);
  {
    SpinLockHolder lock(&shard_->mu);
    shard_->stats.active_bytes.Increase(/*small=*/true, 512);
  }
  ExpectViolation("stream 0x0 stat active_bytes.all.current is 512 but the blocks say 0");
}

TEST_F(InvariantCheckerTest, SegmentStatisticsThatDisagreeWithTheSegments) {
  AddFreeSegment(0x200000, 2 * kMiB);
  {
    MutexLock lock(&device_mu_);
    ledger_.stats().reserved_bytes.Decrease(/*small=*/true, 512);
  }
  ExpectViolation("device stat reserved_bytes.all.current is 2096640 but the blocks say 2097152");
}

TEST_F(InvariantCheckerTest, APoolsReservedBytes) {
  {
    MutexLock lock(&device_mu_);
    const PoolId id = pools_.Create({}, nullptr);
    pools_.Find(id)->reserved_bytes = 4096;
    pools_.Find(id)->peak_reserved_bytes = 4096;
  }
  ExpectViolation("pool 1 reserved_bytes is 4096 but its segments hold 0");
}

TEST_F(InvariantCheckerTest, AHandleAlignedSegmentKeepsFreeBlocksApartAtAChunkEdge) {
  AddTwoChunkSegment(0x40000000, /*handle_aligned=*/true);
  EXPECT_TRUE(Check().ok()) << Check();
}

TEST_F(InvariantCheckerTest, FreeBlocksApartAtAChunkEdgeOfAnOrdinarySegment) {
  AddTwoChunkSegment(0x40000000, /*handle_aligned=*/false);
  ExpectViolation("adjacent free blocks 0x40000000 and 0x40200000 were not merged");
}

TEST_F(InvariantCheckerTest, AHandleAlignedSegmentsBlockAcrossTwoChunks) {
  Segment* s = AddTwoChunkSegment(0x40000000, /*handle_aligned=*/true);
  {
    // Merged by hand across the chunk edge, as a coalescing that forgot the rule would.
    SpinLockHolder lock(&shard_->mu);
    Block* head = s->head;
    Block* second = head->next;
    shard_->large_pool.Erase(head);
    shard_->large_pool.Erase(second);
    head->size += second->size;
    head->next = second->next;
    head->next->prev = head;
    shard_->arena.Delete(second);
    shard_->large_pool.Insert(head);
  }
  ExpectViolation(
      "block 0x40000000 (4194304 bytes) of handle-aligned segment 0x40000000 spans more than one physical "
      "handle");
}

}  // namespace
}  // namespace graphalloc
