// Planning one growth of an expandable segment (expandable_segments.h): which unmapped range of the
// shard's segment a request maps, and where its physical memory comes from. Planned under the shard's
// lock, the sources under the device lock too; carried out with no lock (ExpandableSegments).
//
// The steps, in order:
//   1. TakeRange: the lowest-address unmapped block that, with a free mapped predecessor and the free or
//      unmapped blocks after it, covers the rounded request (PyTorch's find_expandable_block); its blocks
//      leave every index (in flight): the mapped ones are the run, the unmapped ones the holes to map.
//   2. FindIdleChunks: the shard's idle chunks (wholly free mapped chunks of its expandable segments,
//      which can move instead of new memory being mapped) and their runs, largest first.
//   3. SourceHoles: for each hole, cached handles first, then idle chunks (whole runs, then low ends, then
//      the smallest one larger than the rest), then new handles of at most the size the caller allows
//      (MaxNewChunkSize).
//   4. CarveStolenChunks: the chosen idle chunks leave their free blocks (in flight until unmapped).
// In a handle-aligned segment (block.h) no block may span two chunks, so step 1 takes the lowest unmapped
// block that fits the request alone (no mapped run) and step 3 maps exactly one handle: a cached one of
// exactly the rounded size, else a new one of that size (never capped), for which idle chunks of at most
// that size are released (they cannot move: each would be a handle of its own in the hole).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_GROWTH_PLAN_H_
#define GRAPHALLOC_ALLOCATOR_CORE_GROWTH_PLAN_H_

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/block_cache.h"
#include "graphalloc/allocator/core/block_pool.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/core/handle_cache.h"
#include "graphalloc/allocator/core/mapping_hooks.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

// Bounds the driver calls of one growth: each reused or moved handle costs a map, an access call and,
// when moved, an unmap.
inline constexpr std::size_t kMaxReusedHandles = 64;

// The largest new handle a growth may create (growth_plan.cc says why). `request`: the rounded request;
// `stranded`: the pool's free bytes outside wholly free chunks; `committed`: reserved, cached and
// in-flight bytes plus this growth's need; `capacity`: the memory cap or the device's memory.
std::size_t MaxNewChunkSize(std::size_t request, std::size_t stranded, std::size_t committed,
                            std::size_t capacity, std::size_t granularity);

struct GrowthPlan {
  // The physical memory for one hole: handles mapped in order from the hole's address.
  struct Source {
    std::size_t size = 0;
    PhysicalHandle handle{};
    int stolen = -1;       // index into `stolen`, or -1 (a cached handle, or a new one)
    bool created = false;  // a new handle, still to create
  };
  struct Hole {
    Block* block = nullptr;  // in flight, unmapped, exactly the size of its sources
    std::vector<Source> sources;
  };
  std::vector<Block*> run;  // in-flight free mapped blocks of the run
  std::vector<Hole> holes;
  std::vector<Block*> stolen;  // in-flight mapped blocks, one idle chunk each
  std::vector<ChunkPlacement> stolen_chunks;
  std::vector<int> peers;
  std::size_t cached_bytes = 0;  // taken from the handle cache
  std::size_t new_bytes = 0;     // to create
  bool over_limit = false;       // the growth passes the memory cap unless cached handles go back first
  // The stolen chunks are not mapped into the holes but released (a handle-aligned growth retires them).
  bool release_stolen = false;
};

class GrowthPlanner {
 public:
  // Plans a growth of `size` (rounded) bytes in `pool`, one of `shard`'s, whose lock the caller holds
  // while it uses the planner.
  GrowthPlanner(StreamShard& shard, BlockPool& pool, BlockCache& blocks, std::size_t size,
                std::size_t granularity, GrowthPlan* plan)
      : shard_(shard), pool_(pool), blocks_(blocks), size_(size), gran_(granularity), plan_(*plan) {}

  bool TakeRange();
  // `may_move`: idle chunks may move (not while the pool is pinned or a capture is underway); a chunk
  // `hooks` says is pinned (MappingHooks::Pinned) never moves.
  void FindIdleChunks(bool may_move, const MappingHooks* hooks = nullptr);
  // The pool's free bytes outside wholly free chunks (after FindIdleChunks).
  std::size_t stranded() const { return stranded_; }
  void SourceHoles(HandleCache& cache, std::size_t max_new_chunk);
  void CarveStolenChunks();

 private:
  struct Idle {
    Block* block;
    ChunkPlacement chunk;
    bool used;
  };
  // The idle chunks of one free block: contiguous, in address order.
  struct IdleRun {
    std::size_t first;
    std::size_t count;
    std::size_t bytes;
  };
  // One hole being sourced: it needs `need` bytes mapped and has room for `room`.
  struct Filling {
    GrowthPlan::Hole& hole;
    std::size_t need;
    std::size_t room;
    std::size_t have = 0;
    std::size_t missing() const { return need - have; }
  };

  // A handle-aligned segment's growth: the unmapped block `u` alone is the range (block.h); idle chunks
  // of at most `need` bytes in all are unmapped and released rather than moved.
  void TakeAlignedHole(Block* u);
  void RetireIdleChunks(std::size_t need);
  void SourceHole(Filling& f, HandleCache& cache, std::size_t max_new_chunk);
  bool WantsMore(const Filling& f) const { return f.have < f.need && reused_ < kMaxReusedHandles; }
  void TakeIdle(Filling& f, Idle& idle);
  void TakeWholeRuns(Filling& f);
  void TakeLowEnds(Filling& f);
  void TakeSmallestLarger(Filling& f);

  StreamShard& shard_;
  BlockPool& pool_;
  BlockCache& blocks_;
  const std::size_t size_;
  const std::size_t gran_;
  GrowthPlan& plan_;
  Block* last_hole_ = nullptr;  // the one hole that may be larger than what it maps
  std::size_t last_need_ = 0;
  std::vector<Idle> idle_;
  std::vector<IdleRun> runs_;  // largest first
  std::size_t stranded_ = 0;
  std::size_t reused_ = 0;  // handles reused or moved so far
  bool aligned_ = false;    // the range is in a handle-aligned segment: one hole, one handle, no moves
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_GROWTH_PLAN_H_
