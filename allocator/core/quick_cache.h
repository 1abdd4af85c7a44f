// A per-stream cache of recently freed blocks by exact size: the allocator's hot path.
//
// A freed block is parked here, unmerged, instead of going through coalescing and the best-fit index; the
// next request of exactly its size on that stream takes it back without touching either. It stays
// transparent: statistics count a parked block as merged with its free neighbours, and the allocator
// flushes the cache (merging every parked block) before any decision that needs the coalesced layout (any
// request it cannot serve exactly, a free that must coalesce, releasing memory). A parked block is handed
// out only when best fit over the coalesced layout would choose the very same address and split
// (CachingAllocator::QuickHitIsBestFit), so allocation decisions are exactly PyTorch's.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_QUICK_CACHE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_QUICK_CACHE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "graphalloc/allocator/core/block.h"

namespace graphalloc {

class QuickCache {
 public:
  static constexpr std::size_t kSlots = 64;
  static constexpr std::uint32_t kMaxPerSlot = 4;

  // Parks `b` (free, not in the index); false when its slot holds another size or is full.
  bool Push(Block* b, const BlockPool* pool) {
    Slot& slot = slots_[SlotOf(b->size)];
    if (slot.count != 0 && (slot.size != b->size || slot.pool != pool)) return false;
    if (slot.count == kMaxPerSlot) return false;
    slot.size = b->size;
    slot.pool = pool;
    b->in_quick = true;
    slot.blocks[slot.count++] = b;
    ++blocks_;
    occupied_ |= std::uint64_t{1} << SlotOf(b->size);
    return true;
  }

  // The most recently parked block of exactly `size` from `pool` (still parked); nullptr if none.
  Block* Peek(std::size_t size, const BlockPool* pool) const {
    const Slot& slot = slots_[SlotOf(size)];
    if (slot.count == 0 || slot.size != size || slot.pool != pool) return nullptr;
    return slot.blocks[slot.count - 1];
  }

  // Takes `b` out of the cache (it is being handed out, merging with a neighbour, or being flushed).
  void Remove(Block* b) {
    const std::size_t index = SlotOf(b->size);
    Slot& slot = slots_[index];
    std::uint32_t i = slot.count - 1;
    while (slot.blocks[i] != b) --i;
    // Keep the others in parking order, so that Peek() still sees the most recent one.
    for (; i + 1 < slot.count; ++i) slot.blocks[i] = slot.blocks[i + 1];
    b->in_quick = false;
    --slot.count;
    --blocks_;
    if (slot.count == 0) occupied_ &= ~(std::uint64_t{1} << index);
  }

  // Calls f(block) for every parked block after removing it from the cache.
  template <typename F>
  void Drain(F f) {
    // f may remove other parked blocks (merging them): re-read the occupancy after each call.
    while (occupied_ != 0) {
      const Slot& slot = slots_[static_cast<std::size_t>(__builtin_ctzll(occupied_))];
      Block* b = slot.blocks[slot.count - 1];
      Remove(b);
      f(b);
    }
  }

  std::size_t size() const { return blocks_; }
  bool empty() const { return blocks_ == 0; }
  // True when `b` is in its slot (for the invariant checker).
  bool Holds(const Block* b) const {
    const Slot& slot = slots_[SlotOf(b->size)];
    for (std::uint32_t i = 0; i < slot.count; ++i) {
      if (slot.blocks[i] == b) return true;
    }
    return false;
  }

 private:
  // The parked blocks live in the slot, not in links inside the blocks: parking and taking back a block
  // writes nothing to it but its in_quick flag.
  struct Slot {
    std::size_t size = 0;
    const BlockPool* pool = nullptr;
    std::uint32_t count = 0;
    std::array<Block*, kMaxPerSlot> blocks{};  // in parking order, the most recent last
  };
  static std::size_t SlotOf(std::size_t size) {
    return static_cast<std::size_t>(((size >> 9) * 0x9E3779B97F4A7C15ull) >> 58);  // top 6 bits: 64 slots
  }
  std::array<Slot, kSlots> slots_{};
  std::size_t blocks_ = 0;
  std::uint64_t occupied_ = 0;  // bit i: slot i holds at least one block
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_QUICK_CACHE_H_
