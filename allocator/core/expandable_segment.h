// An expandable segment's physical side: a reserved virtual address range and the chunks of physical memory
// mapped into it (CUDA VMM), plus the driver sequences that map and unmap chunks.
//
// A chunk is one physical handle (cuMemCreate) mapped at one address; its size is whatever the growth that
// mapped it needed (a multiple of the granularity), because the driver's cost is per handle, not per byte.
// A chunk is unmapped only as a whole. While the segment's pool sleeps (pool_sleep.h) its chunks are
// asleep: the range and its blocks stay, the physical memory is gone until the wake maps it again. The block
// side (which ranges are allocated, free or unmapped) lives in the segment's block chain; CheckInvariants()
// verifies that the two agree.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENT_H_
#define GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENT_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

struct MappedChunk {
  std::size_t size = 0;
  PhysicalHandle handle{};
};

// A chunk whose pool sleeps. Normally it holds no physical memory; a wake that failed and whose undo the
// driver refused leaves it mapped (`mapped`) with `handle`, which the next wake reuses as it is.
struct SleepingChunk {
  std::size_t size = 0;
  bool mapped = false;
  PhysicalHandle handle{};
};

// A physical handle placed (or to be placed) at an address.
struct ChunkPlacement {
  DevicePtr ptr = 0;
  std::size_t size = 0;
  PhysicalHandle handle{};
};

class ExpandableSegment {
 public:
  ExpandableSegment(DevicePtr base, std::size_t size) : base_(base), size_(size) {}

  DevicePtr base() const { return base_; }
  std::size_t size() const { return size_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }
  const absl::btree_map<DevicePtr, MappedChunk>& chunks() const { return chunks_; }
  const absl::btree_map<DevicePtr, SleepingChunk>& sleeping_chunks() const { return sleeping_; }
  std::size_t sleeping_bytes() const { return sleeping_bytes_; }
  // Set while the pool sleeps, and while a sleep is on its way: the release paths leave such a segment
  // alone (its chunks are the sleep's to unmap and the wake's to map).
  bool asleep() const { return asleep_; }
  void set_asleep(bool asleep) { asleep_ = asleep; }
  // A mapped chunk falls asleep (its memory was released), or a sleeping one is mapped again.
  void ChunkAsleep(DevicePtr ptr) {
    auto it = chunks_.find(ptr);
    sleeping_.emplace(ptr, SleepingChunk{it->second.size, false, {}});
    sleeping_bytes_ += it->second.size;
    mapped_bytes_ -= it->second.size;
    chunks_.erase(it);
  }
  void ChunkAwake(const ChunkPlacement& c) {
    auto it = sleeping_.find(c.ptr);
    sleeping_bytes_ -= it->second.size;
    sleeping_.erase(it);
    AddChunk(c);
  }
  // A sleeping chunk left mapped by a failed wake (or no longer).
  void SetSleepingMapping(DevicePtr ptr, bool mapped, PhysicalHandle handle) {
    SleepingChunk& c = sleeping_.at(ptr);
    c.mapped = mapped;
    c.handle = handle;
  }

  void AddChunk(const ChunkPlacement& c) {
    chunks_.emplace(c.ptr, MappedChunk{c.size, c.handle});
    mapped_bytes_ += c.size;
  }
  void RemoveChunk(DevicePtr ptr) {
    auto it = chunks_.find(ptr);
    mapped_bytes_ -= it->second.size;
    chunks_.erase(it);
  }
  // Whether a chunk, mapped or asleep, starts at `ptr`: between two mapped blocks, a chunk boundary.
  bool ChunkStartsAt(DevicePtr ptr) const { return chunks_.contains(ptr) || sleeping_.contains(ptr); }
  // Whether a chunk, mapped or asleep, starts inside (begin, end): a block there would span two chunks.
  bool ChunkStartsWithin(DevicePtr begin, DevicePtr end) const {
    auto m = chunks_.upper_bound(begin);
    auto s = sleeping_.upper_bound(begin);
    return (m != chunks_.end() && m->first < end) || (s != sleeping_.end() && s->first < end);
  }
  // The chunks lying wholly inside [begin, end), in address order.
  std::vector<ChunkPlacement> ChunksWithin(DevicePtr begin, DevicePtr end) const {
    std::vector<ChunkPlacement> out;
    for (auto it = chunks_.lower_bound(begin); it != chunks_.end() && it->first + it->second.size <= end;
         ++it) {
      out.push_back({it->first, it->second.size, it->second.handle});
    }
    return out;
  }

 private:
  DevicePtr base_;
  std::size_t size_;
  absl::btree_map<DevicePtr, MappedChunk> chunks_;
  std::size_t mapped_bytes_ = 0;
  absl::btree_map<DevicePtr, SleepingChunk> sleeping_;
  std::size_t sleeping_bytes_ = 0;
  bool asleep_ = false;
};

// Maps each chunk at its address, then grants access (this device and `peers`) over [first, last) of them,
// which must be contiguous. On failure, unmaps what it mapped and returns the error; a chunk whose undo
// unmap also fails stays mapped *without access* (access is granted only once every chunk is mapped) and
// is appended to `no_access`: the caller keeps accounting for it and must not hand it out (it quarantines
// it: CachingAllocator::SettleInFlight).
absl::Status MapChunks(Driver& driver, std::span<const ChunkPlacement> chunks, std::span<const int> peers,
                       std::vector<ChunkPlacement>* no_access);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_EXPANDABLE_SEGMENT_H_
