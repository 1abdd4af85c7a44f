// Growth planning on hand-made expandable segments: which range a request takes, how much of the last
// hole it maps (rounded to the granularity), where the pages come from (cached handles, idle chunks that
// move, new handles) and the chunk-size policy.
#include "graphalloc/allocator/core/growth_plan.h"

#include <memory>
#include <vector>

#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/history/history_ring.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

constexpr std::size_t kGran = 2 * kMiB;

TEST(MaxNewChunkSizeTest, FinePagesNearCapacityElseBoundedHandles) {
  const std::size_t capacity = 80 * kGiB;
  // Far from capacity: handles of up to 48 MiB.
  EXPECT_EQ(MaxNewChunkSize(64 * kMiB, 0, kGiB, capacity, kGran), 48 * kMiB);
  // A large growth of a pool with (almost) nothing stranded: up to 1 GiB.
  EXPECT_EQ(MaxNewChunkSize(512 * kMiB, 32 * kMiB, kGiB, capacity, kGran), kGiB);
  EXPECT_EQ(MaxNewChunkSize(512 * kMiB, 33 * kMiB, kGiB, capacity, kGran), 48 * kMiB);
  // Past 30% of the capacity: single pages.
  EXPECT_EQ(MaxNewChunkSize(512 * kMiB, 0, 25 * kGiB, capacity, kGran), kGran);
  // Never below one page, and a multiple of it.
  EXPECT_EQ(MaxNewChunkSize(64 * kMiB, 0, 0, capacity, 20 * kMiB), 40 * kMiB);
  EXPECT_EQ(MaxNewChunkSize(64 * kMiB, 0, 0, capacity, 64 * kMiB), 64 * kMiB);
}

class GrowthPlannerTest : public ::testing::Test {
 protected:
  // An expandable segment of the shard's large pool at `base`: [mapped free `mapped` bytes][unmapped].
  Segment* AddSegment(DevicePtr base, std::size_t size, std::size_t mapped) {
    segments_.push_back(std::make_unique<Segment>());
    Segment* s = segments_.back().get();
    s->base = base;
    s->size = size;
    s->shard = &shard_;
    s->pool = &shard_.large_pool;
    s->expandable = true;
    s->vmm = std::make_unique<ExpandableSegment>(base, size);
    SpinLockHolder lock(&shard_.mu);
    Block* head = shard_.arena.New();
    head->ptr = base;
    head->size = size;
    head->segment = s;
    s->head = head;
    s->vmm->AddChunk({base, mapped, PhysicalHandle{base}});
    Block* rest = blocks_.SplitOff(shard_, head, base + mapped);
    rest->mapped = false;
    shard_.large_pool.Insert(head);
    shard_.large_pool.unmapped.emplace(rest->ptr, rest);
    return s;
  }

  HistoryRing history_;
  BlockCache blocks_{Config{}, history_};
  StreamShard shard_{kDefaultStream, nullptr};
  std::vector<std::unique_ptr<Segment>> segments_;
  HandleCache handles_;
};

TEST_F(GrowthPlannerTest, TakesTheFreePredecessorAndMapsTheRestRoundedToPages) {
  Segment* s = AddSegment(0x100000000, 64 * kMiB, 2 * kMiB);
  handles_.Put(2 * kMiB, PhysicalHandle{99});
  SpinLockHolder lock(&shard_.mu);
  GrowthPlan plan;
  GrowthPlanner planner(shard_, shard_.large_pool, blocks_, 5 * kMiB, kGran, &plan);
  ASSERT_TRUE(planner.TakeRange());
  ASSERT_EQ(plan.run.size(), 1u);
  EXPECT_EQ(plan.run[0], s->head);
  ASSERT_EQ(plan.holes.size(), 1u);
  EXPECT_TRUE(plan.holes[0].block->in_flight);
  planner.FindIdleChunks(/*may_move=*/true);
  EXPECT_EQ(planner.stranded(), 0u);
  planner.SourceHoles(handles_, 48 * kMiB);
  planner.CarveStolenChunks();
  // 5 MiB from the segment's base: the hole maps up to the page after 5 MiB, 4 MiB of it: the cached
  // handle, then a new one for the rest.
  const std::vector<GrowthPlan::Source>& sources = plan.holes[0].sources;
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].size, 2 * kMiB);
  EXPECT_EQ(sources[0].handle, PhysicalHandle{99});
  EXPECT_FALSE(sources[0].created);
  EXPECT_EQ(sources[1].size, 2 * kMiB);
  EXPECT_TRUE(sources[1].created);
  EXPECT_EQ(plan.cached_bytes, 2 * kMiB);
  EXPECT_EQ(plan.new_bytes, 2 * kMiB);
  EXPECT_EQ(handles_.count(), 0u);
  // The hole keeps what it maps; the rest stays unmapped and indexed.
  EXPECT_EQ(plan.holes[0].block->size, 4 * kMiB);
  ASSERT_EQ(shard_.large_pool.unmapped.size(), 1u);
  EXPECT_EQ(shard_.large_pool.unmapped.begin()->first, s->base + 6 * kMiB);
  EXPECT_TRUE(plan.stolen.empty());
}

TEST_F(GrowthPlannerTest, IdleChunksMoveInsteadOfNewMemory) {
  AddSegment(0x100000000, 64 * kMiB, 2 * kMiB);
  Segment* other = AddSegment(0x200000000, 64 * kMiB, 4 * kMiB);  // a wholly free 4 MiB chunk
  SpinLockHolder lock(&shard_.mu);
  GrowthPlan plan;
  GrowthPlanner planner(shard_, shard_.large_pool, blocks_, 6 * kMiB, kGran, &plan);
  ASSERT_TRUE(planner.TakeRange());
  planner.FindIdleChunks(/*may_move=*/true);
  planner.SourceHoles(handles_, 48 * kMiB);
  planner.CarveStolenChunks();
  ASSERT_EQ(plan.holes.size(), 1u);
  ASSERT_EQ(plan.holes[0].sources.size(), 1u);
  EXPECT_EQ(plan.holes[0].sources[0].stolen, 0);
  EXPECT_EQ(plan.new_bytes, 0u);
  ASSERT_EQ(plan.stolen.size(), 1u);
  EXPECT_EQ(plan.stolen[0], other->head);  // carved out of its free block, in flight until unmapped
  EXPECT_TRUE(plan.stolen[0]->in_flight);
  EXPECT_EQ(plan.stolen_chunks[0].ptr, other->base);
  EXPECT_EQ(plan.stolen_chunks[0].size, 4 * kMiB);
}

TEST_F(GrowthPlannerTest, NothingMovesWhenMovingIsNotAllowed) {
  AddSegment(0x100000000, 64 * kMiB, 2 * kMiB);
  AddSegment(0x200000000, 64 * kMiB, 4 * kMiB);
  SpinLockHolder lock(&shard_.mu);
  GrowthPlan plan;
  GrowthPlanner planner(shard_, shard_.large_pool, blocks_, 6 * kMiB, kGran, &plan);
  ASSERT_TRUE(planner.TakeRange());
  planner.FindIdleChunks(/*may_move=*/false);
  EXPECT_EQ(planner.stranded(), 4 * kMiB);  // the other segment's free mapped bytes count as stranded
  planner.SourceHoles(handles_, 48 * kMiB);
  planner.CarveStolenChunks();
  EXPECT_TRUE(plan.stolen.empty());
  EXPECT_EQ(plan.new_bytes, 4 * kMiB);
}

TEST_F(GrowthPlannerTest, NoRangeFits) {
  SpinLockHolder lock(&shard_.mu);
  GrowthPlan plan;
  GrowthPlanner planner(shard_, shard_.large_pool, blocks_, 6 * kMiB, kGran, &plan);
  EXPECT_FALSE(planner.TakeRange());
}

}  // namespace
}  // namespace graphalloc
