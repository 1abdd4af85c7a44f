// The allocated blocks of one stream by address: what Free() and RecordStream() look pointers up in.
//
// A direct-mapped table of recent allocations sits in front of a hash map: a block allocated and freed
// again soon (the hot path) touches one table entry and never the hash map; a block whose entry is taken by
// a newer one moves to the hash map. Every allocated block is in exactly one of the two.
#ifndef GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_
#define GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "allocator/block.h"

namespace graphalloc {

class PointerMap {
 public:
  void Insert(DevicePtr ptr, Block* block) {
    Entry& e = recent_[Slot(ptr)];
    if (e.block != nullptr) overflow_.emplace(e.ptr, e.block);
    e = Entry{ptr, block};
    ++size_;
  }

  Block* Find(DevicePtr ptr) const {
    const Entry& e = recent_[Slot(ptr)];
    if (e.block != nullptr && e.ptr == ptr) return e.block;
    if (overflow_.empty()) return nullptr;
    auto it = overflow_.find(ptr);
    return it == overflow_.end() ? nullptr : it->second;
  }

  // False when `ptr` is not in the map.
  bool Erase(DevicePtr ptr) {
    Entry& e = recent_[Slot(ptr)];
    if (e.block != nullptr && e.ptr == ptr) {
      e = Entry{};
    } else if (overflow_.empty() || overflow_.erase(ptr) == 0) {
      return false;
    }
    --size_;
    return true;
  }

  std::size_t size() const { return size_; }

 private:
  struct Entry {
    DevicePtr ptr = 0;
    Block* block = nullptr;
  };
  static constexpr int kSlotBits = 8;
  static std::size_t Slot(DevicePtr ptr) {
    return static_cast<std::size_t>(((ptr >> 9) * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }
  std::array<Entry, std::size_t{1} << kSlotBits> recent_{};
  absl::flat_hash_map<DevicePtr, Block*> overflow_;
  std::size_t size_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_POINTER_MAP_H_
