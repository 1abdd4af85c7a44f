// libgraphalloc_torch.so: what PyTorch's CUDAPluggableAllocator needs from graphalloc beyond plain C.
//
// 1. Out-of-memory errors. PyTorch never checks the pointer its pluggable alloc function returns, so a null
//    return becomes a tensor at address 0. This malloc throws c10::OutOfMemoryError instead, which PyTorch's
//    bindings turn into torch.cuda.OutOfMemoryError (and other failures into RuntimeError).
// 2. CUDA graph pools. PyTorch's hooks (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
//    set_release_pool) take C++ types: a MempoolId_t pair and a std::function stream filter. These functions
//    implement them over graphalloc's C ABI: a PyTorch pool id maps to a graphalloc private pool on its
//    device (created on first use, one reference per beginAllocateToPool, dropped by releasePool, as PyTorch
//    counts them), and each capture's filter becomes a predicate route in capture mode, opened before the
//    capture begins exactly as PyTorch opens its own.
//
// Python finds the hooks through graphalloc_torch_shim_hook(name) (an address for PyTorch's setters) and
// passes the malloc/free names to CUDAPluggableAllocator. Built only against a PyTorch
// (python/CMakeLists.txt); everything it exports is extern "C" and named graphalloc_torch_shim_*.
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "graphalloc/allocator/c_api/graphalloc.h"
#include "python/csrc/torch_hook_types.h"

#ifdef GRAPHALLOC_TORCH_HOOK_CHECK_HEADER
#include "torch_hook_check.h"  // written by python/CMakeLists.txt's check of PyTorch's hook types
#endif
#ifndef GRAPHALLOC_TORCH_POOL_HOOK_TYPES
#define GRAPHALLOC_TORCH_POOL_HOOK_TYPES 0
#endif
#ifndef GRAPHALLOC_TORCH_BUILT_FOR
#define GRAPHALLOC_TORCH_BUILT_FOR ""
#endif
#ifndef GRAPHALLOC_TORCH_POOL_HOOK_CHECK
#define GRAPHALLOC_TORCH_POOL_HOOK_CHECK "the build did not check PyTorch's pool hook types"
#endif

#define GRAPHALLOC_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace graphalloc_torch {
namespace {

// The pluggable allocator's malloc must not return null on failure: throw what PyTorch throws.
void* Malloc(std::size_t size, int device, CudaStream stream) {
  // PyTorch refuses these before asking its allocator, in these words (its tests match them).
  TORCH_CHECK_WITH(OutOfMemoryError, size < (std::size_t{1} << 60),
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  void* ptr = nullptr;
  const int code = graphalloc_malloc(&ptr, size, device, stream);
  if (code == GRAPHALLOC_OK) return ptr;
  const std::string message = graphalloc_last_error();
  if (code == GRAPHALLOC_OUT_OF_MEMORY)
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory (graphalloc). ", message);
  TORCH_CHECK(false, "graphalloc could not allocate ", size, " bytes on device ", device, ": ", message);
  return nullptr;  // not reached: TORCH_CHECK(false, ...) throws
}

struct PoolKey {
  int device;
  MempoolId id;
  auto operator<=>(const PoolKey&) const = default;
};

std::string Describe(const PoolKey& key) {
  return "mempool (" + std::to_string(key.id.first) + ", " + std::to_string(key.id.second) + ") of device " +
         std::to_string(key.device);
}

// A PyTorch pool: its graphalloc pool, and the references PyTorch holds (beginAllocateToPool calls not yet
// matched by releasePool). Each is one graphalloc reference taken through the C ABI.
struct TorchPool {
  std::uint64_t pool = 0;
  int references = 0;
};

// An open route: graphalloc's handle and the filter it calls (owned here until the route has ended).
struct TorchRoute {
  std::uint64_t route = 0;
  std::unique_ptr<StreamFilter> filter;
};

// The pool whose route the calling thread opened last: CUDAGraph.capture_begin runs the hook on the thread
// that called it, where Python's clean-up of a failed capture (graphalloc.torch) looks it up.
thread_local PoolKey last_begun{};
thread_local bool has_last_begun = false;

class PoolTable {
 public:
  static PoolTable& Get() {
    static PoolTable* table = new PoolTable();  // never destroyed: graphs may be reset during exit
    return *table;
  }

  void Begin(const PoolKey& key, StreamFilter filter) {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(!routes_.contains(key), "graphalloc: beginAllocateToPool: already routing to ",
                Describe(key));
    auto it = pools_.find(key);
    std::uint64_t pool = it != pools_.end() ? it->second.pool : 0;
    int code = it != pools_.end() ? graphalloc_pool_retain(key.device, pool)
                                  : graphalloc_pool_create(key.device, nullptr, &pool);
    TORCH_CHECK(code == GRAPHALLOC_OK, "graphalloc: cannot take a reference to the private pool for ",
                Describe(key), ": ", graphalloc_last_error());
    TorchRoute route{0, std::make_unique<StreamFilter>(std::move(filter))};
    code = graphalloc_begin_allocate_to_pool_if(key.device, pool, &CallFilter, route.filter.get(),
                                                /*capture_mode=*/1, &route.route);
    if (code != GRAPHALLOC_OK) {
      const std::string message = graphalloc_last_error();
      (void)graphalloc_pool_release(key.device, pool);  // the reference just taken; the pool may go with it
      TORCH_CHECK(false, "graphalloc: cannot route allocations to the private pool for ", Describe(key), ": ",
                  message);
    }
    pools_[key] = TorchPool{pool, it != pools_.end() ? it->second.references + 1 : 1};
    routes_.emplace(key, std::move(route));
    last_begun = key;
    has_last_begun = true;
  }

  // Never throws: PyTorch calls it from CUDAGraph::capture_end, and an error of the frees the route's end
  // runs does not make the capture wrong.
  void End(const PoolKey& key) {
    TorchRoute route;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = routes_.find(key);
      if (it == routes_.end()) {
        std::fprintf(stderr, "graphalloc: endAllocateToPool: not routing to %s\n", Describe(key).c_str());
        return;
      }
      route = std::move(it->second);
      routes_.erase(it);
    }
    // Outside the lock: ending waits for filter calls under way on other threads, which never take it.
    if (graphalloc_end_route(route.route) != GRAPHALLOC_OK) {
      std::fprintf(stderr, "graphalloc: endAllocateToPool for %s: %s\n", Describe(key).c_str(),
                   graphalloc_last_error());
    }
  }  // the filter goes now: graphalloc never calls it after graphalloc_end_route has returned

  // Never throws: PyTorch calls it from CUDAGraph::reset, which destructors call.
  void Release(const PoolKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(key);
    if (it == pools_.end()) {
      std::fprintf(stderr, "graphalloc: releasePool: %s holds no reference\n", Describe(key).c_str());
      return;
    }
    if (graphalloc_pool_release(key.device, it->second.pool) != GRAPHALLOC_OK) {
      std::fprintf(stderr, "graphalloc: releasePool for %s: %s\n", Describe(key).c_str(),
                   graphalloc_last_error());
    }
    if (--it->second.references == 0) pools_.erase(it);
  }

  // Whether `key` has an open route; its graphalloc pool id, if it has one.
  bool Lookup(const PoolKey& key, bool* route_open, std::uint64_t* pool) {
    std::lock_guard<std::mutex> lock(mu_);
    *route_open = routes_.contains(key);
    auto it = pools_.find(key);
    if (it == pools_.end()) return false;
    *pool = it->second.pool;
    return true;
  }

  int OpenRoutes() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(routes_.size());
  }

 private:
  // graphalloc's predicate over PyTorch's filter. PyTorch's filter may throw (a failed CUDA call): no match.
  static int CallFilter(void* filter, graphalloc_stream stream) {
    try {
      return (*static_cast<StreamFilter*>(filter))(stream) ? 1 : 0;
    } catch (...) {
      return 0;
    }
  }

  std::mutex mu_;
  std::map<PoolKey, TorchPool> pools_;
  std::map<PoolKey, TorchRoute> routes_;
};

void BeginAllocateToPool(int device, MempoolId id, StreamFilter filter) {
  PoolTable::Get().Begin(PoolKey{device, id}, std::move(filter));
}
void EndAllocateToPool(int device, MempoolId id) { PoolTable::Get().End(PoolKey{device, id}); }
void ReleasePool(int device, MempoolId id) { PoolTable::Get().Release(PoolKey{device, id}); }

// Compile-time proof that the functions handed to PyTorch have the types its setters call them through.
[[maybe_unused]] constexpr MallocFn* kMalloc = &Malloc;
[[maybe_unused]] constexpr BeginAllocateToPoolFn* kBegin = &BeginAllocateToPool;
[[maybe_unused]] constexpr EndAllocateToPoolFn* kEnd = &EndAllocateToPool;
[[maybe_unused]] constexpr ReleasePoolFn* kRelease = &ReleasePool;

}  // namespace
}  // namespace graphalloc_torch

using graphalloc_torch::PoolKey;
using graphalloc_torch::PoolTable;

// CUDAPluggableAllocator's alloc function: throws on failure (see the file comment).
GRAPHALLOC_SHIM_EXPORT void* graphalloc_torch_shim_malloc(size_t size, int device, graphalloc_stream stream) {
  return graphalloc_torch::Malloc(size, device, stream);
}

// CUDAPluggableAllocator's free function: graphalloc_torch_free (errors go to stderr: PyTorch frees from
// destructors, where an exception would end the process).
GRAPHALLOC_SHIM_EXPORT void graphalloc_torch_shim_free(void* ptr, size_t size, int device,
                                                       graphalloc_stream stream) {
  graphalloc_torch_free(ptr, size, device, stream);
}

// The address of a hook for PyTorch's setter: "begin_allocate_to_pool", "end_allocate_to_pool" or
// "release_pool"; NULL for another name, or when this build left the pool hooks out (see
// graphalloc_torch_shim_pool_hooks_unavailable).
GRAPHALLOC_SHIM_EXPORT void* graphalloc_torch_shim_hook(const char* name) {
  if (!GRAPHALLOC_TORCH_POOL_HOOK_TYPES || name == nullptr) return nullptr;
  if (std::strcmp(name, "begin_allocate_to_pool") == 0)
    return reinterpret_cast<void*>(&graphalloc_torch::BeginAllocateToPool);
  if (std::strcmp(name, "end_allocate_to_pool") == 0)
    return reinterpret_cast<void*>(&graphalloc_torch::EndAllocateToPool);
  if (std::strcmp(name, "release_pool") == 0) return reinterpret_cast<void*>(&graphalloc_torch::ReleasePool);
  return nullptr;
}

// torch.__version__ of the PyTorch this was compiled against ("" if unknown): its C++ types and ABI are
// that PyTorch's, so graphalloc.torch uses it with that version only.
GRAPHALLOC_SHIM_EXPORT const char* graphalloc_torch_shim_built_for(void) {
  return GRAPHALLOC_TORCH_BUILT_FOR;
}

// NULL when the pool hooks are in this build; else why not (the build's check of PyTorch's hook types).
GRAPHALLOC_SHIM_EXPORT const char* graphalloc_torch_shim_pool_hooks_unavailable(void) {
  return GRAPHALLOC_TORCH_POOL_HOOK_TYPES ? nullptr : GRAPHALLOC_TORCH_POOL_HOOK_CHECK;
}

// The PyTorch pool whose route the calling thread opened last (for Python's clean-up of a capture that
// failed before PyTorch could end its route). Returns 1 and fills the outputs, or 0 if it opened none.
GRAPHALLOC_SHIM_EXPORT int graphalloc_torch_shim_last_begun(int* device, unsigned long long* first,
                                                            unsigned long long* second) {
  if (device == nullptr || first == nullptr || second == nullptr || !graphalloc_torch::has_last_begun)
    return 0;
  *device = graphalloc_torch::last_begun.device;
  *first = graphalloc_torch::last_begun.id.first;
  *second = graphalloc_torch::last_begun.id.second;
  return 1;
}

// The graphalloc pool of a PyTorch pool: returns 1 and sets *pool (and *route_open: whether a capture
// routes to it now), or 0 when graphalloc holds no pool for it.
GRAPHALLOC_SHIM_EXPORT int graphalloc_torch_shim_pool_of(int device, unsigned long long first,
                                                         unsigned long long second, uint64_t* pool,
                                                         int* route_open) {
  bool open = false;
  std::uint64_t id = 0;
  const bool found = PoolTable::Get().Lookup(PoolKey{device, {first, second}}, &open, &id);
  if (route_open != nullptr) *route_open = open ? 1 : 0;
  if (found && pool != nullptr) *pool = id;
  return found ? 1 : 0;
}

// After a capture failed before PyTorch ended its route (cudaStreamEndCapture raised in capture_end, so
// endAllocateToPool never ran): ends the route if it is open, and with release_reference != 0 also drops the
// reference beginAllocateToPool took, for a graph that PyTorch will never release (its capture never
// ended). Without this, the allocator would stay in capture mode for good.
GRAPHALLOC_SHIM_EXPORT void graphalloc_torch_shim_abandon(int device, unsigned long long first,
                                                          unsigned long long second, int release_reference) {
  const PoolKey key{device, {first, second}};
  bool open = false;
  std::uint64_t pool = 0;
  PoolTable::Get().Lookup(key, &open, &pool);
  if (open) PoolTable::Get().End(key);
  if (release_reference != 0) PoolTable::Get().Release(key);
}

// Routes PyTorch opened and has not ended (0 when no capture is under way).
GRAPHALLOC_SHIM_EXPORT int graphalloc_torch_shim_open_routes(void) { return PoolTable::Get().OpenRoutes(); }
