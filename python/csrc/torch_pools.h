// PyTorch's memory pools (CUDA graph pools, torch.cuda.MemPool) on graphalloc private pools, for both ways
// into PyTorch: the backend (torch_backend.h) and the pluggable path's pool hooks (torch_shim.cc), each with
// a table of its own.
//
// PyTorch names a pool by (device, MempoolId_t) and counts its references itself: createOrIncrefPool and
// each beginAllocateToPool take one, releasePool drops one. The table holds one graphalloc PrivatePool
// handle per PyTorch pool while PyTorch holds any reference; once the last goes, graphalloc keeps the pool
// only as long as its blocks live, then returns its memory (PyTorch's own allocator waits for the next
// emptyCache; the memory is unused either way). The graphalloc pool is created on first use, not by
// createOrIncrefPool, because PyTorch sets use_on_oom and no_split after creating a MemPool and graphalloc
// fixes a pool's options when it is created.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_POOLS_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_POOLS_H_

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/pool_checkpoint.h"

namespace graphalloc_torch {

// A PyTorch pool's identity: its device and PyTorch's id.
struct TorchPoolKey {
  c10::DeviceIndex device = 0;
  c10::MempoolId_t id{0, 0};
  auto operator<=>(const TorchPoolKey&) const = default;
};

// getCheckpointState's result: the graphalloc checkpoint of one pool, restorable by setCheckpointPoolState.
struct GraphallocPoolState final : c10::cuda::CUDACachingAllocator::AllocatorState {
  TorchPoolKey key;
  graphalloc::PrivatePool pool;  // keeps the graphalloc pool while the state exists
  graphalloc::PoolCheckpoint checkpoint;
};

class TorchPoolTable {
 public:
  // `allocator_of(device)` is the device's graphalloc allocator (created on first use; throws on failure).
  explicit TorchPoolTable(std::function<graphalloc::CachingAllocator&(c10::DeviceIndex)> allocator_of)
      : allocator_of_(std::move(allocator_of)) {}

  // `allocator` (null: graphalloc itself) is where the pool's segments come from: another CUDAAllocator
  // (PyTorch's MemPool(allocator=...), e.g. a CUDAPluggableAllocator over ncclMemAlloc) whose allocations
  // graphalloc caches and splits for the pool, keeping it alive while any of them is held.
  void CreateOrIncref(const TorchPoolKey& key,
                      std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator = nullptr);
  // Takes a reference and routes the allocations `filter` accepts to the pool until End(); allocations are
  // in capture mode meanwhile (no event queries, nothing returned to the device), as PyTorch's allocator
  // treats every pool route as a capture underway.
  void Begin(const TorchPoolKey& key, std::function<bool(cudaStream_t)> filter);
  // Never throws: PyTorch calls it from CUDAGraph::capture_end. An unknown route is reported on stderr.
  void End(const TorchPoolKey& key);
  // Never throws: PyTorch calls it from destructors.
  void Release(const TorchPoolKey& key);
  // PyTorch's references to the pool (0 for a pool it does not know).
  int UseCount(const TorchPoolKey& key);
  void SetUseOnOom(const TorchPoolKey& key, bool use_on_oom);
  void SetNoSplit(const TorchPoolKey& key);
  // Makes the pool a communication pool with handle-aligned placement (graphalloc.torch.register_nccl):
  // every mapping stays mapped, registered once, and every block lies inside one of them. Before its
  // first allocation only, as setNoSplit.
  void SetCommunication(const TorchPoolKey& key);
  // Whether the pool's allocated blocks are exactly `expected` (PyTorch's checkPoolLiveAllocations).
  bool CheckLiveAllocations(const TorchPoolKey& key, const std::unordered_set<void*>& expected);
  // Returns the pool's cached free memory to the device; nothing for a pool graphalloc never created.
  void EmptyCache(const TorchPoolKey& key);

  std::shared_ptr<GraphallocPoolState> Checkpoint(const TorchPoolKey& key);
  // Restores `state`. `freed`: blocks allocated before and free now, or allocated before and again now
  // (PyTorch frees every block of the pool and allocates the checkpoint's: a pointer may be in both lists);
  // `allocated`: every block the checkpoint has allocated, each now owned by the caller.
  struct Restored {
    std::vector<void*> freed;
    std::vector<std::pair<void*, std::size_t>> allocated;
  };
  Restored Restore(const GraphallocPoolState& state);

  // Routes begun and not ended (0 outside captures and use_mem_pool blocks).
  int OpenRoutes();
  // The pool whose route the calling thread began last, in this table or another, if any
  // (CUDAGraph.capture_begin begins it on the calling thread; graphalloc.torch's clean-up of a failed
  // capture looks it up there).
  std::optional<TorchPoolKey> LastBegunOnThisThread() const;
  bool RouteOpen(const TorchPoolKey& key);
  // After a capture failed before PyTorch ended its route (cudaStreamEndCapture raised in capture_end, so
  // endAllocateToPool never ran): ends the route if it is open and, with `release`, drops the reference
  // beginAllocateToPool took, for a graph PyTorch will never release. Left open, the route would keep the
  // allocator in capture mode for good.
  void Abandon(const TorchPoolKey& key, bool release);
  // The graphalloc pool behind a PyTorch pool, if PyTorch holds a reference and it was used.
  std::optional<graphalloc::PoolId> GraphallocIdOf(const TorchPoolKey& key);

  // The PyTorch id of graphalloc pool `pool` on `device`: {0, 0} for the default pool, and {0, pool} for a
  // graphalloc pool PyTorch does not name (created through graphalloc's own API).
  c10::MempoolId_t TorchIdOf(c10::DeviceIndex device, graphalloc::PoolId pool);

 private:
  struct Entry {
    int references = 0;
    graphalloc::PoolOptions options;
    std::shared_ptr<graphalloc::SegmentSource> source;  // null: the driver
    graphalloc::PrivatePool pool;                       // empty until first used
  };

  Entry& Find(const TorchPoolKey& key, const char* operation);
  // The entry's graphalloc pool, created with the entry's options on first use.
  graphalloc::PrivatePool& PoolOf(const TorchPoolKey& key, Entry& entry);

  const std::function<graphalloc::CachingAllocator&(c10::DeviceIndex)> allocator_of_;
  std::mutex mu_;
  std::map<TorchPoolKey, Entry> entries_;
  std::map<TorchPoolKey, graphalloc::PoolRoute> routes_;
};

// The key of PyTorch's pool (device, id) as the C entry points and PyTorch's pool hooks name it (the device
// as an int); nullopt for a device number no c10::DeviceIndex holds.
std::optional<TorchPoolKey> TorchPoolKeyOf(int device, c10::MempoolId_t id);

// The C functions graphalloc.torch calls to clean up after a failed capture, which libgraphalloc_torch.so
// exports for each of its tables with the same signatures (graphalloc_torch_shim_* for the pluggable path's,
// graphalloc_torch_backend_* for the backend's):
//   LastBegun: the pool whose route the calling thread began last; 1 and the outputs, or 0 if none.
int LastBegun(const TorchPoolTable& table, int* device, unsigned long long* first,
              unsigned long long* second);
//   RouteOf: whether a route to the pool is open (*route_open) and its graphalloc pool (*pool); 1 when
//   graphalloc holds a pool for it, else 0.
int RouteOf(TorchPoolTable& table, int device, unsigned long long first, unsigned long long second,
            std::uint64_t* pool, int* route_open);
//   Abandon: TorchPoolTable::Abandon (release != 0: drop the reference too).
void Abandon(TorchPoolTable& table, int device, unsigned long long first, unsigned long long second,
             int release);

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_POOLS_H_
