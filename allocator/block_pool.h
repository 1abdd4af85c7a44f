// A pool of free blocks of one size kind (small or large) of one memory pool (the device's default pool
// or a private pool) on one stream, indexed for best fit by (size, address).
#ifndef GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_
#define GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "allocator/block.h"

namespace graphalloc {

struct FreeKey {
  std::size_t size;
  DevicePtr ptr;
  Block* block;

  friend bool operator<(const FreeKey& a, const FreeKey& b) {
    return a.size != b.size ? a.size < b.size : a.ptr < b.ptr;
  }
};

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}

  // Smallest free block with size >= `size` (lowest address among equals), or end().
  absl::btree_set<FreeKey>::iterator LowerBound(std::size_t size) {
    return blocks.lower_bound(FreeKey{size, 0, nullptr});
  }
  void Insert(Block* b) { blocks.insert(FreeKey{b->size, b->ptr, b}); }
  void Erase(Block* b) { blocks.erase(FreeKey{b->size, b->ptr, b}); }
  bool Contains(const Block* b) const {
    return blocks.contains(FreeKey{b->size, b->ptr, const_cast<Block*>(b)});
  }

  const bool is_small;
  absl::btree_set<FreeKey> blocks;
  // Unmapped address ranges of this pool's expandable segments, by address (never in `blocks`).
  absl::btree_map<DevicePtr, Block*> unmapped;
  std::uint64_t free_block_lookups = 0;  // clock for garbage-collection ages
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_
