// The allocated blocks of one stream by address: what Free() and RecordStream() look pointers up in.
//
// An open-addressing hash table with linear probing whose entries hold the address and the block side by
// side: a lookup reads one cache line in the common case. (A general-purpose hash map keeps its control
// bytes apart from its entries, so each lookup missed the cache twice with 100k live blocks, and a
// direct-mapped table of recent allocations in front of it added a third miss per allocation when it
// evicted an entry into the map.) A block allocated and freed again soon (the hot path) reuses the same
// entry, which stays in the cache. The table doubles when half full and never shrinks, so it allocates
// nothing in steady state; erasing shifts later entries back instead of leaving tombstones, so probe
// sequences stay short however many blocks come and go. A table of 2 MiB or more (from 64k live blocks)
// sits in huge pages (huge_page_memory.h).
#ifndef GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_
#define GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "allocator/block.h"
#include "allocator/huge_page_memory.h"

namespace graphalloc {

class PointerMap {
 public:
  PointerMap() { Rehash(kInitialBits); }

  // `ptr` must not be in the map.
  void Insert(DevicePtr ptr, Block* block) {
    if (2 * (size_ + 1) > mask_ + 1) Rehash(bits_ + 1);
    Place(ptr, block);
    ++size_;
  }

  Block* Find(DevicePtr ptr) const {
    for (std::size_t i = Home(ptr);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.block == nullptr) return nullptr;
      if (e.ptr == ptr) return e.block;
    }
  }

  // False when `ptr` is not in the map.
  bool Erase(DevicePtr ptr) {
    std::size_t hole = Home(ptr);
    for (;; hole = (hole + 1) & mask_) {
      if (entries_[hole].block == nullptr) return false;
      if (entries_[hole].ptr == ptr) break;
    }
    // Backward-shift deletion: move each later entry of the cluster into the hole unless its home lies
    // cyclically in (hole, i], where it must stay to remain reachable.
    for (std::size_t i = (hole + 1) & mask_; entries_[i].block != nullptr; i = (i + 1) & mask_) {
      const std::size_t home = Home(entries_[i].ptr);
      const bool stays = hole <= i ? (hole < home && home <= i) : (hole < home || home <= i);
      if (!stays) {
        entries_[hole] = entries_[i];
        hole = i;
      }
    }
    entries_[hole] = Entry{};
    --size_;
    return true;
  }

  // Starts loading the entry `ptr` would use, for a caller that will insert or look it up shortly.
  void Prefetch(DevicePtr ptr) const { __builtin_prefetch(&entries_[Home(ptr)]); }

  std::size_t size() const { return size_; }

 private:
  struct Entry {
    DevicePtr ptr = 0;
    Block* block = nullptr;  // nullptr: the entry is empty
  };
  static constexpr int kInitialBits = 8;  // 256 entries, 4 KiB

  struct TableDeleter {
    std::size_t bytes;
    void operator()(Entry* table) const {
      if (bytes >= kHugePageSize) {
        FreeHugePageMemory(table);
      } else {
        delete[] table;
      }
    }
  };
  using Table = std::unique_ptr<Entry[], TableDeleter>;
  static Table NewTable(std::size_t capacity) {
    const std::size_t bytes = capacity * sizeof(Entry);
    if (bytes < kHugePageSize) return Table(new Entry[capacity], TableDeleter{bytes});
    auto* table = static_cast<Entry*>(AllocateHugePageMemory(bytes));
    std::uninitialized_default_construct_n(table, capacity);
    return Table(table, TableDeleter{bytes});
  }

  // Fibonacci hashing of the 512-byte-aligned address: neighbouring blocks land far apart.
  std::size_t Home(DevicePtr ptr) const {
    return static_cast<std::size_t>(((ptr >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }
  void Place(DevicePtr ptr, Block* block) {
    std::size_t i = Home(ptr);
    while (entries_[i].block != nullptr) i = (i + 1) & mask_;
    entries_[i] = Entry{ptr, block};
  }
  void Rehash(int bits) {
    Table old = std::move(entries_);
    const std::size_t old_capacity = old == nullptr ? 0 : mask_ + 1;
    bits_ = bits;
    mask_ = (std::size_t{1} << bits) - 1;
    entries_ = NewTable(mask_ + 1);
    for (std::size_t i = 0; i < old_capacity; ++i) {
      if (old[i].block != nullptr) Place(old[i].ptr, old[i].block);
    }
  }

  Table entries_;
  std::size_t mask_ = 0;
  int bits_ = 0;
  std::size_t size_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_
