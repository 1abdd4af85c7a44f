// The allocated blocks of one stream by address: what Free() and RecordStream() look pointers up in.
//
// An open-addressing hash table with linear probing over 8-byte entries: each holds the block's pointer and
// a tag of the address's hash, and the address itself is read from the block (Block::ptr), which every
// caller reads next anyway. A lookup reads one cache line of the table in the common case; with 100k live
// blocks the table is 2 MiB instead of the 4 MiB that {address, block} pairs took, so more of it and of
// the blocks stays in the cache (a churn touches a random entry per operation). A block allocated and
// freed again soon (the hot path) reuses the same entry, which stays in the cache. The table doubles when
// half full and never shrinks, so it allocates nothing in steady state; erasing shifts later entries back
// instead of leaving tombstones, so probe sequences stay short however many blocks come and go. A table of
// 2 MiB or more (from 128k live blocks) sits in huge pages (huge_page_memory.h).
//
// Encoding: Blocks are 64-byte aligned and user-space pointers have 48 significant bits, so an entry is
// the block's pointer shifted up by 16 with the top 22 bits of the address's hash below it. Those bits are
// the home slot of an entry while the table has at most 2^22 slots, so rehashing and erasing read no block;
// past that they read the address from the block. A block whose pointer does not fit (never seen on
// x86-64 or AArch64 without an explicit request for high addresses) goes to a small side map instead.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POINTER_MAP_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POINTER_MAP_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "absl/container/flat_hash_map.h"
#include "graphalloc/allocator/base/huge_page_memory.h"
#include "graphalloc/allocator/core/block.h"

namespace graphalloc {

// kPointerBits: how many low bits of a Block pointer an entry keeps (tests use other values to reach the
// side map and the large-table path with few blocks).
template <int kPointerBits = 48>
class BasicPointerMap {
 public:
  BasicPointerMap() { Rehash(kInitialBits); }

  // `ptr` must not be in the map, and must be `block->ptr` for as long as it is in the map.
  void Insert(DevicePtr ptr, Block* block) {
    if (!Fits(block)) [[unlikely]] {
      wide_.emplace(ptr, block);
      ++size_;
      return;
    }
    if (2 * (size_ - wide_.size() + 1) > mask_ + 1) Rehash(bits_ + 1);
    Place(Encode(Hash(ptr), block));
    ++size_;
  }

  Block* Find(DevicePtr ptr) const {
    const std::uint64_t hash = Hash(ptr);
    const std::uint64_t tag = TagOf(hash);
    for (std::size_t i = HomeOfHash(hash);; i = (i + 1) & mask_) {
      const std::uint64_t e = entries_[i];
      if (e == 0) return wide_.empty() ? nullptr : FindWide(ptr);
      if ((e & kTagMask) == tag) {
        Block* b = BlockOf(e);
        if (b->ptr == ptr) return b;
      }
    }
  }

  // False when `ptr` is not in the map.
  bool Erase(DevicePtr ptr) {
    const std::uint64_t hash = Hash(ptr);
    const std::uint64_t tag = TagOf(hash);
    std::size_t hole = HomeOfHash(hash);
    for (;; hole = (hole + 1) & mask_) {
      const std::uint64_t e = entries_[hole];
      if (e == 0) return EraseWide(ptr);
      if ((e & kTagMask) == tag && BlockOf(e)->ptr == ptr) break;
    }
    // Backward-shift deletion: move each later entry of the cluster into the hole unless its home lies
    // cyclically in (hole, i], where it must stay to remain reachable.
    for (std::size_t i = (hole + 1) & mask_; entries_[i] != 0; i = (i + 1) & mask_) {
      const std::size_t home = HomeOfEntry(entries_[i]);
      const bool stays = hole <= i ? (hole < home && home <= i) : (hole < home || home <= i);
      if (!stays) {
        entries_[hole] = entries_[i];
        hole = i;
      }
    }
    entries_[hole] = 0;
    --size_;
    return true;
  }

  // Starts loading the entry `ptr` would use, for a caller that will insert or look it up shortly.
  void Prefetch(DevicePtr ptr) const { __builtin_prefetch(&entries_[HomeOfHash(Hash(ptr))]); }

  std::size_t size() const { return size_; }

 private:
  static_assert(kPointerBits > 6 && kPointerBits <= 58);
  static constexpr int kShift = 64 - kPointerBits;
  static constexpr int kTagBits = kShift + 6;  // below the pointer, and in its 6 zero low bits
  static constexpr std::uint64_t kTagMask = (std::uint64_t{1} << kTagBits) - 1;
  static constexpr int kInitialBits = 8;  // 256 entries, 2 KiB

  static bool Fits(const Block* block) {
    return (reinterpret_cast<std::uintptr_t>(block) >> kPointerBits) == 0;
  }
  // Fibonacci hashing of the 512-byte-aligned address: neighbouring blocks land far apart.
  static std::uint64_t Hash(DevicePtr ptr) { return (ptr >> 9) * 0x9E3779B97F4A7C15ull; }
  static std::uint64_t TagOf(std::uint64_t hash) { return hash >> (64 - kTagBits); }
  static std::uint64_t Encode(std::uint64_t hash, Block* block) {
    return (reinterpret_cast<std::uintptr_t>(block) << kShift) | TagOf(hash);
  }
  static Block* BlockOf(std::uint64_t e) {
    return reinterpret_cast<Block*>((e >> kShift) & ~std::uint64_t{alignof(Block) - 1});
  }
  std::size_t HomeOfHash(std::uint64_t hash) const { return static_cast<std::size_t>(hash >> (64 - bits_)); }
  std::size_t HomeOfEntry(std::uint64_t e) const {
    if (bits_ <= kTagBits) return static_cast<std::size_t>((e & kTagMask) >> (kTagBits - bits_));
    return HomeOfHash(Hash(BlockOf(e)->ptr));
  }
  Block* FindWide(DevicePtr ptr) const {
    auto it = wide_.find(ptr);
    return it == wide_.end() ? nullptr : it->second;
  }
  bool EraseWide(DevicePtr ptr) {
    if (wide_.empty() || wide_.erase(ptr) == 0) return false;
    --size_;
    return true;
  }

  // Small tables come from calloc and large ones from huge pages, both freed with free(): one deallocation
  // for both, which GCC's -Wmismatched-new-delete can follow.
  struct TableDeleter {
    std::size_t bytes;
    void operator()(std::uint64_t* table) const {
      if (bytes >= kHugePageSize) {
        FreeHugePageMemory(table);
      } else {
        std::free(table);
      }
    }
  };
  using Table = std::unique_ptr<std::uint64_t[], TableDeleter>;
  static Table NewTable(std::size_t capacity) {
    const std::size_t bytes = capacity * sizeof(std::uint64_t);
    if (bytes < kHugePageSize) {
      void* table = std::calloc(capacity, sizeof(std::uint64_t));
      if (table == nullptr) throw std::bad_alloc();
      return Table(static_cast<std::uint64_t*>(table), TableDeleter{bytes});
    }
    auto* table = static_cast<std::uint64_t*>(AllocateHugePageMemory(bytes));
    std::uninitialized_value_construct_n(table, capacity);
    return Table(table, TableDeleter{bytes});
  }

  void Place(std::uint64_t e) {
    std::size_t i = HomeOfEntry(e);
    while (entries_[i] != 0) i = (i + 1) & mask_;
    entries_[i] = e;
  }
  void Rehash(int bits) {
    Table old = std::move(entries_);
    const std::size_t old_capacity = old == nullptr ? 0 : mask_ + 1;
    bits_ = bits;
    mask_ = (std::size_t{1} << bits) - 1;
    entries_ = NewTable(mask_ + 1);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i] != 0) Place(old[i]);
    }
  }

  Table entries_;  // 0: empty (a block pointer is never null)
  std::size_t mask_ = 0;
  int bits_ = 0;
  std::size_t size_ = 0;                         // entries in the table and in wide_
  absl::flat_hash_map<DevicePtr, Block*> wide_;  // blocks whose pointer does not fit an entry
};

using PointerMap = BasicPointerMap<>;

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POINTER_MAP_H_
