// Blocks and segments: the allocator's model of device memory.
//
// A segment is one device allocation (or, for expandable segments, one reserved address range). It is
// carved into blocks that chain in address order (prev/next); a block is allocated, free (in its pool's
// free index) or waiting for stream events. Every block of a segment belongs to the segment's stream,
// because a freed block is reused only by the stream it was allocated on.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_BLOCK_H_
#define GRAPHALLOC_ALLOCATOR_CORE_BLOCK_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "graphalloc/allocator/base/huge_page_memory.h"
#include "graphalloc/allocator/core/expandable_segment.h"
#include "graphalloc/allocator/core/segment_source.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

struct BlockPool;
struct Segment;
struct StreamShard;

// The streams a block was recorded on besides its own (RecordStream), while it is allocated. One pointer,
// null while there are none (the common case), so that a Block fits one cache line; the list itself is on
// the heap, which only RecordStream() and a Free() with stream uses touch (both make driver calls anyway).
class StreamUses {
 public:
  bool empty() const { return list_ == nullptr; }
  const Stream* begin() const { return list_ == nullptr ? nullptr : list_->data(); }
  const Stream* end() const { return list_ == nullptr ? nullptr : list_->data() + list_->size(); }
  void push_back(Stream s) {
    if (list_ == nullptr) list_ = std::make_unique<std::vector<Stream>>();
    list_->push_back(s);
  }
  void clear() { list_.reset(); }

 private:
  std::unique_ptr<std::vector<Stream>> list_;
};

// One cache line (64 bytes, 64-byte aligned): with 100k live blocks most Block touches miss the cache, and
// a churn operation touches the freed block, its two neighbours and the block it allocates; a smaller
// block also makes the arena, which those touches land in at random, half as large as a two-line one, so
// that more of it stays in the cache. Hence the bit-field flags, the stream taken from the segment, and the
// requested size sharing its word with the free-time age.
struct alignas(64) Block {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  Block* prev = nullptr;  // address-ordered neighbours within the segment
  Block* next = nullptr;
  Segment* segment = nullptr;
  union {
    std::size_t requested_size = 0;  // while allocated: the caller's unrounded size
    // While free: the pool clock when the block became free, its age for garbage collection (which alone
    // reads it, and only with a threshold set).
    std::uint64_t gc_count_base;
  };
  StreamUses stream_uses;  // other streams recorded with RecordStream, while allocated (cleared when freed)
  int event_count = 0;     // stream events still to complete before the block may be reused
  bool allocated : 1 = false;
  bool mapped : 1 = true;     // false only for unmapped address ranges of an expandable segment
  bool freeing : 1 = false;   // Free() is recording its stream events with the lock released
  bool in_quick : 1 = false;  // free, and parked in its shard's QuickCache rather than the free index
  // Taken out of every index while its shard's lock is released for driver calls (an expandable segment
  // growing into it or unmapping it); nothing merges with it or allocates it meanwhile.
  bool in_flight : 1 = false;
  // Allocated and held (CachingAllocator::HoldBlock: mapped by another process): a Free() waits for the
  // last hold to go.
  bool held : 1 = false;
  // In its shard's pointer map: every allocated block, and a block parked straight from a free until it
  // leaves the quick cache (StreamShard::AddToPointerMap).
  bool in_pointer_map : 1 = false;

  bool IsSplit() const { return prev != nullptr || next != nullptr; }
  // Its owner freed it, and the free waits (its stream events are being recorded, or a capture defers it
  // until the last capture route ends): still in the pointer map, but counted and shown as freed and still
  // active, as PyTorch's allocator marks a block not allocated the moment it is freed.
  bool OwnerFreed() const { return allocated && freeing && !held; }
  // Every block of a segment belongs to the segment's stream.
  Stream stream() const;
  // Back to a default-constructed state.
  void Reset() {
    ptr = 0;
    size = requested_size = 0;
    segment = nullptr;
    prev = next = nullptr;
    allocated = freeing = in_quick = in_flight = held = in_pointer_map = false;
    mapped = true;
    event_count = 0;
    stream_uses.clear();
  }
  DevicePtr end() const { return ptr + size; }
};
static_assert(sizeof(Block) == 64, "a Block is one cache line");

struct Segment {
  DevicePtr base = 0;
  std::size_t size = 0;
  Stream stream = kDefaultStream;
  StreamShard* shard = nullptr;  // the shard of `stream`, which owns every block of the segment
  BlockPool* pool = nullptr;
  Block* head = nullptr;
  bool expandable = false;
  // Expandable segments only: no mapped block spans two chunks (Config::handle_aligned,
  // PoolOptions::handle_aligned), because NCCL and RDMA registration see only the handle under a pointer.
  bool handle_aligned = false;
  // Where the memory came from when not the driver (PoolOptions::segment_source); it goes back there.
  std::shared_ptr<SegmentSource> source;
  // Expandable segments only: the reservation's mapped chunks (guarded by the owning shard's lock).
  std::unique_ptr<ExpandableSegment> vmm;
  // Intrusive list of every segment of the allocator, for snapshots and invariant checks.
  Segment* prev_segment = nullptr;
  Segment* next_segment = nullptr;
};

inline Stream Block::stream() const { return segment->stream; }

// Recycles Block objects so that splitting and merging never touch the heap once warmed up. Chunks double
// from 256 blocks up to 2 MiB; those come in huge pages (huge_page_memory.h), so that a shard with many
// blocks does not pay a TLB miss on most of its block touches.
class BlockArena {
 public:
  BlockArena() = default;
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  Block* New() {
    if (free_ == nullptr) Grow();
    Block* b = free_;
    free_ = b->next;
    b->Reset();
    ++live_;
    return b;
  }
  void Delete(Block* b) {
    b->stream_uses.clear();
    b->next = free_;
    free_ = b;
    --live_;
  }
  std::size_t live() const { return live_; }

 private:
  static constexpr std::size_t kFirstChunk = 256;
  static constexpr std::size_t kMaxChunk = kHugePageSize / sizeof(Block);

  static bool Huge(std::size_t count) { return count * sizeof(Block) >= kHugePageSize; }
  struct ChunkDeleter {
    std::size_t count;
    void operator()(Block* chunk) const {
      std::destroy_n(chunk, count);
      if (Huge(count)) {
        FreeHugePageMemory(chunk);
      } else {
        ::operator delete (chunk, std::align_val_t{alignof(Block)});
      }
    }
  };

  void Grow() {
    const std::size_t n = next_chunk_;
    void* raw = Huge(n) ? AllocateHugePageMemory(n * sizeof(Block))
                        : ::operator new (n * sizeof(Block), std::align_val_t{alignof(Block)});
    Block* chunk = static_cast<Block*>(raw);
    std::uninitialized_default_construct_n(chunk, n);
    chunks_.push_back(std::unique_ptr<Block, ChunkDeleter>(chunk, ChunkDeleter{n}));
    next_chunk_ = std::min(2 * n, kMaxChunk);
    for (std::size_t i = 0; i < n; ++i) {
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
  }
  std::vector<std::unique_ptr<Block, ChunkDeleter>> chunks_;
  std::size_t next_chunk_ = kFirstChunk;
  Block* free_ = nullptr;
  std::size_t live_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_BLOCK_H_
