// What PrivatePool, PoolRoute and GraphPin have in common: each holds one thing of an allocator (a use of
// a pool, an open route, a pin) that must be given back exactly once. PoolHandle is that holding, written
// once: it moves with the handle (the source is left empty), and gives the thing back when reset,
// reassigned or destroyed.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_POOL_HANDLE_H_
#define GRAPHALLOC_ALLOCATOR_CORE_POOL_HANDLE_H_

#include <utility>

namespace graphalloc {

class CachingAllocator;

// `Target` says what is held (a pool id, a route); `kGiveBack` gives it back to the allocator.
template <typename Target, void (*kGiveBack)(CachingAllocator&, const Target&)>
class PoolHandle {
 public:
  PoolHandle() = default;
  PoolHandle(CachingAllocator* allocator, Target target) : allocator_(allocator), target_(target) {}
  PoolHandle(const PoolHandle&) = delete;
  PoolHandle& operator=(const PoolHandle&) = delete;
  PoolHandle(PoolHandle&& other) noexcept
      : allocator_(std::exchange(other.allocator_, nullptr)), target_(other.target_) {}
  PoolHandle& operator=(PoolHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      allocator_ = std::exchange(other.allocator_, nullptr);
      target_ = other.target_;
    }
    return *this;
  }
  ~PoolHandle() { Reset(); }

  // Gives the target back (nothing when empty); the handle is empty afterwards.
  void Reset() {
    if (CachingAllocator* allocator = Release()) kGiveBack(*allocator, target_);
  }
  // Empties the handle without giving anything back: the caller does, and gets the allocator to do it with.
  CachingAllocator* Release() { return std::exchange(allocator_, nullptr); }

  // nullptr when empty.
  CachingAllocator* allocator() const { return allocator_; }
  // What is (or was last) held; kept when the handle empties.
  const Target& target() const { return target_; }

 private:
  CachingAllocator* allocator_ = nullptr;
  Target target_{};
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_POOL_HANDLE_H_
