// Private memory pools: sets of segments kept apart from the default cache, the foundation of CUDA graph
// support (a graph replays into the addresses its capture allocated, so those must stay reserved for it).
//
// A pool is shared by handing its PrivatePool handle around (copies are users; the use count is exact).
// While a PoolRoute is open, allocations that match its filter (a stream, the capture a stream belongs
// to, or the calling thread) go to the pool; routes nest and the innermost (latest opened) match wins.
// A GraphPin says a graph that replays into the pool exists: while any pin lives, none of the pool's
// memory goes back to the device, not even by EmptyCache. A pool with no users, no pins and no live
// blocks returns all its memory and disappears.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_PRIVATE_POOL_H_
#define GRAPHALLOC_ALLOCATOR_CORE_PRIVATE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "graphalloc/allocator/core/pool_handle.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class CachingAllocator;

// 0 is the default pool (the ordinary cache); private pools get 1, 2, ... in creation order.
using PoolId = std::uint64_t;
inline constexpr PoolId kDefaultPool = 0;

struct PoolOptions {
  // A default-pool allocation that would otherwise fail may take this pool's cached free blocks (no new
  // segment is created in the pool for it). PyTorch's MemPool(use_on_oom=True).
  bool use_on_oom = false;
  // Blocks of this pool are never split: each allocation gets a segment of its own, sized to the request
  // (rounded to the device's granularity), for memory registered whole with other libraries (NCCL).
  bool no_split = false;
  // No block of the pool's expandable segments spans two physical handles (Config::handle_aligned, for
  // this pool only): for memory registered with NCCL or RDMA, which see one handle per pointer.
  bool handle_aligned = false;
  // A name for sleeping and waking pools together (CachingAllocator::Sleep with SleepScope::Tag); several
  // pools may share one. Empty: no tag.
  std::string tag{};
  // A communication pool: every chunk is pinned when mapped (CachingAllocator::PinMapping) and stays mapped,
  // registered once with the libraries observing mappings (mapping_observer.h), until the pool itself is
  // destroyed: EmptyCache, the release before out-of-memory and growths leave its chunks where they are,
  // and it cannot sleep.
  bool communication = false;
  // The pool's expandable segments create their physical memory exportable, so that its blocks can be
  // shared with other processes (BlockExporter, docs/sharing.md); Config::shareable_handles does it for
  // every pool.
  bool shareable = false;
  // Who made the pool, for people: snapshots (PoolSnapshot::owner) and out-of-memory reports name it
  // ("torch.cuda.MemPool (0, 3)", "CUDA graph pool (1, 0)", "graph tree"). Empty: the tag, if any.
  std::string owner{};
};

struct PoolStats {
  std::size_t reserved_bytes = 0;  // mapped or allocated device memory of the pool's segments
  std::size_t peak_reserved_bytes = 0;
  std::size_t allocated_bytes = 0;  // bytes of the pool's live blocks
  std::size_t peak_allocated_bytes = 0;
  std::size_t segments = 0;
  std::size_t live_blocks = 0;     // allocated blocks (including frees deferred until a capture ends)
  int use_count = 0;               // PrivatePool handles
  int graph_pins = 0;              // GraphPins
  bool asleep = false;             // CachingAllocator::Sleep (pool_sleep.h)
  std::size_t sleeping_bytes = 0;  // address space whose physical memory is asleep (not in reserved_bytes)
  std::size_t backup_bytes = 0;    // pinned host memory held for its backup (SleepState::backup_bytes)
  // Mapped bytes no release may unmap: chunks (or regular segments) with a pinned byte (PinMapping), or all
  // of a communication pool's.
  std::size_t pinned_bytes = 0;
};

// Which allocations a route sends to its pool.
struct PoolRouteFilter {
  enum class Kind { kStream, kCapture, kThread, kPredicate };
  Kind kind = Kind::kThread;
  Stream stream = kDefaultStream;  // kStream: that stream
  std::uint64_t capture_id = 0;    // kCapture: any stream whose current capture has this id
  std::thread::id thread{};        // kThread: allocations made by this thread
  // kPredicate: allocations on the streams for which it returns true. For callers whose rule is not one
  // of the above: PyTorch hands its allocator an opaque std::function<bool(cudaStream_t)> before the
  // capture it belongs to has begun. It is called with no allocator lock held, from whichever thread
  // allocates, possibly from several at once; never after the route's End() has returned (so it may refer
  // to objects that die then). It must not throw (an exception counts as false) nor end routes.
  std::function<bool(Stream)> predicate{};
  // The route puts the allocator in capture mode while it is open (see
  // CachingAllocator::BeginAllocateToPool), whatever its kind; kCapture routes always do. For a route opened
  // before its capture begins, so that nothing the capture forbids happens from its first moment on.
  bool capture_mode = false;

  static PoolRouteFilter ForStream(Stream s) { return {.kind = Kind::kStream, .stream = s}; }
  // Filled from Driver::GetCaptureInfo(capturing_stream) when the route opens: every stream joined into
  // that capture matches, and nothing matches once the capture ends.
  static PoolRouteFilter ForCaptureOf(Stream capturing_stream) {
    return {.kind = Kind::kCapture, .stream = capturing_stream};
  }
  static PoolRouteFilter ForCallingThread() {
    return {.kind = Kind::kThread, .thread = std::this_thread::get_id()};
  }
  static PoolRouteFilter ForPredicate(std::function<bool(Stream)> predicate, bool capture_mode) {
    return {.kind = Kind::kPredicate, .predicate = std::move(predicate), .capture_mode = capture_mode};
  }
  bool IsCaptureRoute() const { return kind == Kind::kCapture || capture_mode; }
};

// A user of a private pool. Copying adds a user; destroying or Reset() drops one.
class PrivatePool {
 public:
  PrivatePool() = default;
  PrivatePool(const PrivatePool& other);
  PrivatePool& operator=(const PrivatePool& other);
  PrivatePool(PrivatePool&& other) noexcept = default;
  PrivatePool& operator=(PrivatePool&& other) noexcept = default;

  // kDefaultPool when empty.
  PoolId id() const { return use_.allocator() != nullptr ? use_.target() : kDefaultPool; }
  explicit operator bool() const { return use_.allocator() != nullptr; }
  CachingAllocator* allocator() const { return use_.allocator(); }
  void Reset() { use_.Reset(); }

 private:
  friend class CachingAllocator;
  static void DropUser(CachingAllocator& allocator, const PoolId& id);
  PrivatePool(CachingAllocator* allocator, PoolId id) : use_(allocator, id) {}
  PoolHandle<PoolId, &PrivatePool::DropUser> use_;
};

// An open route (see CachingAllocator::BeginAllocateToPool). Ends when destroyed or End() is called; the
// route holds a use of its pool until then.
class PoolRoute {
 public:
  PoolRoute() = default;
  PoolRoute(PoolRoute&& other) noexcept = default;
  PoolRoute& operator=(PoolRoute&& other) noexcept = default;  // ends the route it had (errors ignored)

  bool active() const { return route_.allocator() != nullptr; }
  PoolId pool() const { return route_.target().pool; }
  // Stops routing. When it was the last capture route, frees deferred during captures record their events
  // now (on streams no longer capturing). Errors of those event records are returned; the route ends anyway.
  // Destroying an open route ends it, ignoring those errors.
  absl::Status End();

 private:
  friend class CachingAllocator;
  struct Target {
    std::uint64_t route_id = 0;
    PoolId pool = kDefaultPool;
  };
  static void EndIgnoringErrors(CachingAllocator& allocator, const Target& route);
  PoolRoute(CachingAllocator* allocator, std::uint64_t route_id, PoolId pool)
      : route_(allocator, Target{route_id, pool}) {}
  PoolHandle<Target, &PoolRoute::EndIgnoringErrors> route_;
};

// Keeps every byte of a pool reserved while a graph that replays into it lives (see the file comment).
class GraphPin {
 public:
  GraphPin() = default;
  GraphPin(GraphPin&& other) noexcept = default;
  GraphPin& operator=(GraphPin&& other) noexcept = default;

  bool active() const { return pin_.allocator() != nullptr; }
  void Reset() { pin_.Reset(); }

 private:
  friend class CachingAllocator;
  static void Unpin(CachingAllocator& allocator, const PoolId& pool);
  GraphPin(CachingAllocator* allocator, PoolId pool) : pin_(allocator, pool) {}
  PoolHandle<PoolId, &GraphPin::Unpin> pin_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_PRIVATE_POOL_H_
