// A pool of free blocks of one size kind (small or large) of one memory pool (the device's default pool
// or a private pool), indexed for best fit by (stream, size, address).
#ifndef GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_
#define GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <tuple>

#include "absl/container/btree_set.h"
#include "allocator/block.h"

namespace graphalloc {

class PrivatePool;

struct FreeKey {
  Stream stream;
  std::size_t size;
  DevicePtr ptr;
  Block* block;

  friend bool operator<(const FreeKey& a, const FreeKey& b) {
    return std::tie(a.stream, a.size, a.ptr) < std::tie(b.stream, b.size, b.ptr);
  }
};

struct BlockPool {
  BlockPool(bool small, PrivatePool* owner) : is_small(small), owner(owner) {}

  // Smallest free block of `stream` with size >= `size` (lowest address among equals), or end().
  absl::btree_set<FreeKey>::iterator LowerBound(Stream stream, std::size_t size) {
    auto it = blocks.lower_bound(FreeKey{stream, size, 0, nullptr});
    if (it != blocks.end() && it->stream != stream) return blocks.end();
    return it;
  }
  void Insert(Block* b) { blocks.insert(FreeKey{b->stream, b->size, b->ptr, b}); }
  void Erase(Block* b) { blocks.erase(FreeKey{b->stream, b->size, b->ptr, b}); }
  bool Contains(const Block* b) const {
    return blocks.contains(FreeKey{b->stream, b->size, b->ptr, const_cast<Block*>(b)});
  }

  const bool is_small;
  PrivatePool* const owner;  // nullptr for the device's default pool
  absl::btree_set<FreeKey> blocks;
  std::uint64_t free_block_lookups = 0;  // clock for garbage-collection ages
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_BLOCK_POOL_H_
