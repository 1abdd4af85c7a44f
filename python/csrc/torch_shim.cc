// libgraphalloc_torch.so: what PyTorch's CUDAPluggableAllocator needs from graphalloc beyond plain C.
//
// 1. Out-of-memory errors. PyTorch never checks the pointer its pluggable alloc function returns, so a null
//    return becomes a tensor at address 0. This malloc throws c10::OutOfMemoryError instead, which PyTorch's
//    bindings turn into torch.cuda.OutOfMemoryError (and other failures into RuntimeError).
// 2. CUDA graph pools. PyTorch's hooks (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn,
//    set_release_pool) take C++ types: a MempoolId_t pair and a std::function stream filter. These functions
//    serve them from a TorchPoolTable (torch_pools.h, the backend's pool table) over the default allocators
//    graphalloc_malloc allocates from: a PyTorch pool id maps to a graphalloc private pool on its device
//    (created on first use, kept while PyTorch counts a reference: one per beginAllocateToPool, dropped by
//    releasePool), and each capture's filter becomes a predicate route in capture mode, opened before the
//    capture begins exactly as PyTorch opens its own.
//
// Python finds the hooks through graphalloc_torch_shim_hook(name) (an address for PyTorch's setters) and
// passes the malloc/free names to CUDAPluggableAllocator. Built only against a PyTorch
// (python/CMakeLists.txt); everything it exports is extern "C" and named graphalloc_torch_shim_*.
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "python/csrc/torch_hook_types.h"
#include "python/csrc/torch_pools.h"

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

// The pluggable path's pools, on the allocators graphalloc_malloc serves.
TorchPoolTable& Pools() {
  static TorchPoolTable* table =  // never destroyed: graphs may be reset during exit
      new TorchPoolTable([](c10::DeviceIndex device) -> graphalloc::CachingAllocator& {
        absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
        TORCH_CHECK(allocator.ok(), "graphalloc: cannot create the allocator of CUDA device ",
                    static_cast<int>(device), ": ", allocator.status().ToString());
        return **allocator;
      });
  return *table;
}

void BeginAllocateToPool(int device, MempoolId id, StreamFilter filter) {
  const std::optional<TorchPoolKey> key = TorchPoolKeyOf(device, id);
  TORCH_CHECK(key.has_value(), "graphalloc: beginAllocateToPool: there is no CUDA device ", device);
  Pools().Begin(*key, std::move(filter));
}
// Never throws: PyTorch calls it from CUDAGraph::capture_end.
void EndAllocateToPool(int device, MempoolId id) {
  if (const std::optional<TorchPoolKey> key = TorchPoolKeyOf(device, id)) Pools().End(*key);
}
// Never throws: PyTorch calls it from CUDAGraph::reset, which destructors call.
void ReleasePool(int device, MempoolId id) {
  if (const std::optional<TorchPoolKey> key = TorchPoolKeyOf(device, id)) Pools().Release(*key);
}

// Compile-time proof that the functions handed to PyTorch have the types its setters call them through.
[[maybe_unused]] constexpr MallocFn* kMalloc = &Malloc;
[[maybe_unused]] constexpr BeginAllocateToPoolFn* kBegin = &BeginAllocateToPool;
[[maybe_unused]] constexpr EndAllocateToPoolFn* kEnd = &EndAllocateToPool;
[[maybe_unused]] constexpr ReleasePoolFn* kRelease = &ReleasePool;

}  // namespace
}  // namespace graphalloc_torch

using graphalloc_torch::Pools;

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
  return graphalloc_torch::LastBegun(Pools(), device, first, second);
}

// The graphalloc pool of a PyTorch pool: returns 1 and sets *pool (and *route_open: whether a capture
// routes to it now), or 0 when graphalloc holds no pool for it.
GRAPHALLOC_SHIM_EXPORT int graphalloc_torch_shim_pool_of(int device, unsigned long long first,
                                                         unsigned long long second, uint64_t* pool,
                                                         int* route_open) {
  return graphalloc_torch::RouteOf(Pools(), device, first, second, pool, route_open);
}

// After a capture failed before PyTorch ended its route (cudaStreamEndCapture raised in capture_end, so
// endAllocateToPool never ran): ends the route if it is open, and with release_reference != 0 also drops the
// reference beginAllocateToPool took, for a graph that PyTorch will never release (its capture never
// ended). Without this, the allocator would stay in capture mode for good.
GRAPHALLOC_SHIM_EXPORT void graphalloc_torch_shim_abandon(int device, unsigned long long first,
                                                          unsigned long long second, int release_reference) {
  graphalloc_torch::Abandon(Pools(), device, first, second, release_reference);
}

// Routes PyTorch opened and has not ended (0 when no capture is under way).
GRAPHALLOC_SHIM_EXPORT int graphalloc_torch_shim_open_routes(void) { return Pools().OpenRoutes(); }
