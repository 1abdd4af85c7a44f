// A pool of free blocks of one size kind (small or large) of one memory pool (the device's default pool
// or a private pool) on one stream, indexed for best fit by (size, address) (free_block_index.h).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_BLOCK_POOL_H_
#define GRAPHALLOC_ALLOCATOR_CORE_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>

#include "absl/container/btree_map.h"
#include "graphalloc/allocator/core/block.h"
#include "graphalloc/allocator/core/free_block_index.h"

namespace graphalloc {

struct BlockPool {
  explicit BlockPool(bool small) : is_small(small) {}

  // Smallest free block with size >= `size` (lowest address among equals), or end().
  FreeBlockIndex::Iterator LowerBound(std::size_t size) const { return blocks.LowerBound(size); }
  void Insert(Block* b) { blocks.Insert(FreeKey{b->size, b->ptr, b}); }
  void Erase(Block* b) { blocks.Erase(FreeKey{b->size, b->ptr, b}); }
  bool Contains(const Block* b) const {
    return blocks.Contains(FreeKey{b->size, b->ptr, const_cast<Block*>(b)});
  }

  const bool is_small;
  FreeBlockIndex blocks;
  // Unmapped address ranges of this pool's expandable segments, by address (never in `blocks`).
  absl::btree_map<DevicePtr, Block*> unmapped;
  std::uint64_t free_block_lookups = 0;  // clock for garbage-collection ages
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_BLOCK_POOL_H_
