#include "python/csrc/torch_pools.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "python/csrc/torch_addresses.h"

namespace graphalloc_torch {
namespace {

std::string Describe(const TorchPoolKey& key) {
  return "mempool (" + std::to_string(key.id.first) + ", " + std::to_string(key.id.second) + ") of device " +
         std::to_string(key.device);
}

// Every allocated block of a checkpoint, as (address, size).
std::vector<std::pair<void*, std::size_t>> AllocatedBlocks(const graphalloc::PoolCheckpoint& checkpoint) {
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (const graphalloc::CheckpointSegment& segment : checkpoint.segments) {
    for (const graphalloc::CheckpointBlock& block : segment.blocks) {
      if (block.allocated) blocks.emplace_back(Pointer(segment.base + block.offset), block.size);
    }
  }
  return blocks;
}

thread_local std::optional<TorchPoolKey> last_begun;

// A MemPool's own CUDAAllocator as the source of its graphalloc pool's segments.
class CudaAllocatorSource final : public graphalloc::SegmentSource {
 public:
  explicit CudaAllocatorSource(std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator)
      : allocator_(std::move(allocator)) {}

  absl::StatusOr<graphalloc::DevicePtr> Allocate(std::size_t bytes, graphalloc::Stream stream) override {
    try {
      void* ptr = allocator_->raw_alloc_with_stream(
          bytes, static_cast<cudaStream_t>(graphalloc::NativeFromStream(stream)));
      if (ptr == nullptr) return absl::ResourceExhaustedError(allocator_->name() + " returned no memory");
      return Address(ptr);
    } catch (const c10::OutOfMemoryError& e) {
      return absl::ResourceExhaustedError(e.what_without_backtrace());
    } catch (const std::exception& e) {
      return absl::InternalError(allocator_->name() + ": " + e.what());
    }
  }

  absl::Status Free(graphalloc::DevicePtr ptr, std::size_t /*bytes*/,
                    graphalloc::Stream /*stream*/) override {
    try {
      allocator_->raw_delete(Pointer(ptr));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::InternalError(allocator_->name() + ": " + e.what());
    }
  }

  std::string Name() const override { return allocator_->name(); }

 private:
  const std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator_;
};

}  // namespace

TorchPoolTable::Entry& TorchPoolTable::Find(const TorchPoolKey& key, const char* operation) {
  auto it = entries_.find(key);
  TORCH_CHECK(it != entries_.end(), "graphalloc: ", operation, ": no pool ", Describe(key),
              " (it was never created, or every reference to it was released)");
  return it->second;
}

graphalloc::PrivatePool& TorchPoolTable::PoolOf(const TorchPoolKey& key, Entry& entry) {
  if (!entry.pool) {
    // For people (snapshots, out-of-memory reports): the MempoolId a MemPool or a CUDA graph has.
    entry.options.owner = absl::StrCat("PyTorch pool (", key.id.first, ", ", key.id.second, ")");
    absl::StatusOr<graphalloc::PrivatePool> pool =
        allocator_of_(key.device).CreatePool(entry.options, entry.source);
    TORCH_CHECK(pool.ok(), "graphalloc: cannot create the private pool for ", Describe(key), ": ",
                pool.status().ToString());
    entry.pool = *std::move(pool);
  }
  return entry.pool;
}

void TorchPoolTable::CreateOrIncref(
    const TorchPoolKey& key, std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = entries_[key];
  if (entry.references++ == 0 && allocator != nullptr) {
    entry.source = std::make_shared<CudaAllocatorSource>(std::move(allocator));
  }
}

void TorchPoolTable::Begin(const TorchPoolKey& key, std::function<bool(cudaStream_t)> filter) {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(!routes_.contains(key), "graphalloc: beginAllocateToPool: already routing to ", Describe(key));
  Entry& entry = entries_[key];
  const bool created = entry.references == 0;
  try {
    graphalloc::PrivatePool& pool = PoolOf(key, entry);
    // PyTorch's filter may throw (a failed CUDA call): no match.
    auto predicate = [filter = std::move(filter)](graphalloc::Stream stream) {
      try {
        return filter(static_cast<cudaStream_t>(graphalloc::NativeFromStream(stream)));
      } catch (...) {
        return false;
      }
    };
    absl::StatusOr<graphalloc::PoolRoute> route = pool.allocator()->BeginAllocateToPool(
        pool, graphalloc::PoolRouteFilter::ForPredicate(std::move(predicate), /*capture_mode=*/true));
    TORCH_CHECK(route.ok(), "graphalloc: cannot route allocations to ", Describe(key), ": ",
                route.status().ToString());
    routes_.emplace(key, *std::move(route));
  } catch (...) {
    if (created) entries_.erase(key);
    throw;
  }
  ++entry.references;
  last_begun = key;
}

void TorchPoolTable::End(const TorchPoolKey& key) {
  graphalloc::PoolRoute route;
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
  // Outside the lock: ending waits for filter calls under way on other threads.
  if (absl::Status s = route.End(); !s.ok()) {
    std::fprintf(stderr, "graphalloc: endAllocateToPool for %s: %s\n", Describe(key).c_str(),
                 s.ToString().c_str());
  }
}

void TorchPoolTable::Release(const TorchPoolKey& key) {
  graphalloc::PrivatePool last;  // dropped after the lock: the pool may return its memory then
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      std::fprintf(stderr, "graphalloc: releasePool: %s holds no reference\n", Describe(key).c_str());
      return;
    }
    if (--it->second.references > 0) return;
    last = std::move(it->second.pool);
    entries_.erase(it);
  }
}

int TorchPoolTable::UseCount(const TorchPoolKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.references;
}

void TorchPoolTable::SetUseOnOom(const TorchPoolKey& key, bool use_on_oom) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = Find(key, "setUseOnOOM");
  entry.options.use_on_oom = use_on_oom;
  if (!entry.pool) return;  // created with it on first use
  absl::Status s = entry.pool.allocator()->SetPoolUseOnOom(entry.pool.id(), use_on_oom);
  TORCH_CHECK(s.ok(), "graphalloc: setUseOnOOM on ", Describe(key), ": ", s.ToString());
}

void TorchPoolTable::SetNoSplit(const TorchPoolKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = Find(key, "setNoSplit");
  TORCH_CHECK(!entry.pool || entry.options.no_split, "graphalloc: setNoSplit on ", Describe(key),
              " after it was first used: graphalloc fixes a pool's options when it first allocates; pass "
              "no_split when creating the MemPool");
  entry.options.no_split = true;
}

void TorchPoolTable::SetCommunication(const TorchPoolKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& entry = Find(key, "register_nccl");
  TORCH_CHECK(!entry.pool || (entry.options.communication && entry.options.handle_aligned),
              "graphalloc: register_nccl on ", Describe(key),
              " after it was first used: graphalloc fixes a pool's options when it first allocates; register "
              "the MemPool before allocating from it");
  entry.options.communication = true;
  entry.options.handle_aligned = true;
}

bool TorchPoolTable::CheckLiveAllocations(const TorchPoolKey& key,
                                          const std::unordered_set<void*>& expected) {
  graphalloc::PrivatePool pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = Find(key, "checkPoolLiveAllocations");
    if (!entry.pool) return expected.empty();
    pool = entry.pool;
  }
  std::size_t live = 0;
  absl::StatusOr<graphalloc::PoolCheckpoint> checkpoint = pool.allocator()->Checkpoint(pool);
  if (checkpoint.ok()) {
    for (const auto& [ptr, size] : AllocatedBlocks(*checkpoint)) {
      if (!expected.contains(ptr)) return false;
      ++live;
    }
    return live == expected.size();
  }
  // Blocks waiting on stream events make the checkpoint refuse; the snapshot shows them as not allocated.
  const graphalloc::MemorySnapshot snapshot =
      pool.allocator()->TakeSnapshot("checkPoolLiveAllocations", /*record_event=*/false);
  for (const graphalloc::SegmentSnapshot& segment : snapshot.segments) {
    if (segment.pool_id != pool.id()) continue;
    for (const graphalloc::BlockSnapshot& block : segment.blocks) {
      if (block.state != graphalloc::BlockState::kAllocated) continue;
      if (!expected.contains(Pointer(block.address))) return false;
      ++live;
    }
  }
  return live == expected.size();
}

void TorchPoolTable::EmptyCache(const TorchPoolKey& key) {
  graphalloc::PrivatePool pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || !it->second.pool) return;
    pool = it->second.pool;
  }
  absl::Status s = pool.allocator()->EmptyPoolCache(pool.id());
  TORCH_CHECK(s.ok(), "graphalloc: emptyCache of ", Describe(key), ": ", s.ToString());
}

std::shared_ptr<GraphallocPoolState> TorchPoolTable::Checkpoint(const TorchPoolKey& key) {
  auto state = std::make_shared<GraphallocPoolState>();
  state->key = key;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state->pool = PoolOf(key, Find(key, "getCheckpointState"));
  }
  absl::StatusOr<graphalloc::PoolCheckpoint> checkpoint = state->pool.allocator()->Checkpoint(state->pool);
  TORCH_CHECK(checkpoint.ok(), "graphalloc: getCheckpointState of ", Describe(key), ": ",
              checkpoint.status().ToString());
  state->checkpoint = *std::move(checkpoint);
  return state;
}

TorchPoolTable::Restored TorchPoolTable::Restore(const GraphallocPoolState& state) {
  absl::StatusOr<graphalloc::RestoreResult> result =
      state.pool.allocator()->Restore(state.pool, state.checkpoint);
  TORCH_CHECK(result.ok(), "graphalloc: setCheckpointPoolState of ", Describe(state.key), ": ",
              result.status().ToString());
  Restored restored;
  restored.allocated = AllocatedBlocks(state.checkpoint);
  std::unordered_set<graphalloc::DevicePtr> created;
  for (const graphalloc::RestoredAllocation& a : result->created) created.insert(a.ptr);
  for (graphalloc::DevicePtr ptr : result->freed) restored.freed.push_back(Pointer(ptr));
  // Live before and allocated in the checkpoint at the same place: graphalloc left them allocated, PyTorch
  // counts them freed and allocated again (the new DataPtr is their owner from now on).
  for (const auto& [ptr, size] : restored.allocated) {
    if (!created.contains(Address(ptr))) restored.freed.push_back(ptr);
  }
  return restored;
}

int TorchPoolTable::OpenRoutes() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(routes_.size());
}

std::optional<TorchPoolKey> TorchPoolTable::LastBegunOnThisThread() const { return last_begun; }

bool TorchPoolTable::RouteOpen(const TorchPoolKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return routes_.contains(key);
}

void TorchPoolTable::Abandon(const TorchPoolKey& key, bool release) {
  if (RouteOpen(key)) End(key);
  if (release) Release(key);
}

std::optional<graphalloc::PoolId> TorchPoolTable::GraphallocIdOf(const TorchPoolKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.pool) return std::nullopt;
  return it->second.pool.id();
}

c10::MempoolId_t TorchPoolTable::TorchIdOf(c10::DeviceIndex device, graphalloc::PoolId pool) {
  if (pool == graphalloc::kDefaultPool) return {0, 0};
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, entry] : entries_) {
    if (key.device == device && entry.pool && entry.pool.id() == pool) return key.id;
  }
  return {0, pool};
}

std::optional<TorchPoolKey> TorchPoolKeyOf(int device, c10::MempoolId_t id) {
  if (device < std::numeric_limits<c10::DeviceIndex>::min() ||
      device > std::numeric_limits<c10::DeviceIndex>::max()) {
    return std::nullopt;
  }
  return TorchPoolKey{static_cast<c10::DeviceIndex>(device), id};
}

int LastBegun(const TorchPoolTable& table, int* device, unsigned long long* first,
              unsigned long long* second) {
  const std::optional<TorchPoolKey> key = table.LastBegunOnThisThread();
  if (!key.has_value() || device == nullptr || first == nullptr || second == nullptr) return 0;
  *device = key->device;
  *first = key->id.first;
  *second = key->id.second;
  return 1;
}

int RouteOf(TorchPoolTable& table, int device, unsigned long long first, unsigned long long second,
            std::uint64_t* pool, int* route_open) {
  const std::optional<TorchPoolKey> key = TorchPoolKeyOf(device, {first, second});
  if (route_open != nullptr) *route_open = key.has_value() && table.RouteOpen(*key) ? 1 : 0;
  const std::optional<graphalloc::PoolId> id = key.has_value() ? table.GraphallocIdOf(*key) : std::nullopt;
  if (id.has_value() && pool != nullptr) *pool = *id;
  return id.has_value() ? 1 : 0;
}

void Abandon(TorchPoolTable& table, int device, unsigned long long first, unsigned long long second,
             int release) {
  if (const std::optional<TorchPoolKey> key = TorchPoolKeyOf(device, {first, second})) {
    table.Abandon(*key, release != 0);
  }
}

}  // namespace graphalloc_torch
