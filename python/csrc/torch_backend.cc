#include "python/csrc/torch_backend.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>

#include "graphalloc/allocator/core/address_owners.h"
#include "graphalloc/allocator/core/size_policy.h"
#include "python/csrc/torch_addresses.h"
#include "python/csrc/torch_snapshot.h"
#include "python/csrc/torch_stats.h"

namespace graphalloc_torch {
namespace {

// Sizes as PyTorch's out-of-memory messages print them, so that programs matching them keep working.
std::string FormatSize(std::uint64_t size) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (size <= 1024) {
    os << size << " bytes";
  } else if (size <= 1048576) {
    os << static_cast<double>(size) / 1024.0 << " KiB";
  } else if (size <= 1073741824ULL) {
    os << static_cast<double>(size) / 1048576.0 << " MiB";
  } else {
    os << static_cast<double>(size) / 1073741824.0 << " GiB";
  }
  return os.str();
}

}  // namespace

TorchBackend& TorchBackend::Get() {
  static TorchBackend* backend = new TorchBackend();  // never destroyed: tensors die during exit too
  return *backend;
}

TorchBackend::TorchBackend()
    : pools_(
          [this](c10::DeviceIndex device) -> graphalloc::CachingAllocator& { return AllocatorOf(device); }),
      ipc_([this](c10::DeviceIndex device) -> graphalloc::CachingAllocator& { return AllocatorOf(device); }) {
}

graphalloc::CachingAllocator* TorchBackend::Existing(c10::DeviceIndex device) {
  return graphalloc::ExistingDefaultAllocator(device);
}

graphalloc::CachingAllocator& TorchBackend::AllocatorOf(c10::DeviceIndex device) {
  if (graphalloc::CachingAllocator* existing = Existing(device)) return *existing;
  std::lock_guard<std::mutex> lock(history_mu_);
  absl::StatusOr<graphalloc::CachingAllocator*> created = graphalloc::DefaultAllocator(device);
  TORCH_CHECK(created.ok(), "graphalloc: cannot create the allocator of CUDA device ",
              static_cast<int>(device), ": ", created.status().ToString());
  if (history_options_.enabled) {
    if (absl::Status s = (*created)->RecordHistory(history_options_); !s.ok()) {
      std::fprintf(stderr, "graphalloc: recording history on device %d: %s\n", static_cast<int>(device),
                   s.ToString().c_str());
    }
  }
  return **created;
}

// ---- Allocation and free: the hot path. ----

void* TorchBackend::Allocate(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  // PyTorch refuses these before anything else (no observer, no history), in these words.
  constexpr size_t kOneExaByte = size_t{1} << 60;
  TORCH_CHECK_WITH(OutOfMemoryError, C10_LIKELY(size < kOneExaByte),
                   "CUDA out of memory. Tried to allocate more than 1EB memory.");
  graphalloc::CachingAllocator& allocator = AllocatorOf(device);
  absl::StatusOr<graphalloc::DevicePtr> ptr = allocator.Allocate(size, graphalloc::StreamFromNative(stream));
  if (!ptr.ok()) {
    if (absl::IsResourceExhausted(ptr.status())) ThrowOutOfMemory(ptr.status(), device, size, stream);
    TORCH_CHECK(false, "graphalloc could not allocate ", size, " bytes on CUDA device ",
                static_cast<int>(device), ": ", ptr.status().ToString());
  }
  void* out = Pointer(*ptr);
  if (history_.active()) history_.OnAlloc(device, out, size, size, stream, {0, 0});
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    ReportToProfiler(device, out, static_cast<std::int64_t>(graphalloc::RoundSize(size, allocator.config())),
                     allocator);
  }
  return out;
}

c10::DataPtr TorchBackend::allocate(size_t size) {
  const c10::DeviceIndex device = c10::cuda::current_device();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  void* ptr = size == 0 ? nullptr : Allocate(size, device, stream);
  return {ptr, ptr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device)};
}

void* TorchBackend::raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const c10::DeviceIndex device = c10::cuda::current_device();
  return Allocate(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* TorchBackend::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  return Allocate(nbytes, c10::cuda::current_device(), stream);
}

void TorchBackend::RawDelete(void* ptr) { Get().Free(ptr); }

void TorchBackend::Free(void* ptr) {
  if (ptr == nullptr) return;
  // The device whose allocator reserved the address, without taking any allocator's lock (AddressOwners):
  // the free goes to that allocator alone.
  const int device = graphalloc::AddressOwners::Global().DeviceOf(Address(ptr));
  graphalloc::CachingAllocator* allocator =
      device < 0 ? nullptr : Existing(static_cast<c10::DeviceIndex>(device));
  if (allocator == nullptr) {
    std::fprintf(stderr, "graphalloc: free of %p: no graphalloc allocator reserved this address\n", ptr);
    return;
  }
  if (absl::Status s = allocator->Free(Address(ptr)); !s.ok()) {
    std::fprintf(stderr, "graphalloc: free of %p on device %d: %s\n", ptr, device, s.ToString().c_str());
    return;
  }
  const auto index = static_cast<c10::DeviceIndex>(device);
  if (C10_UNLIKELY(ipc_.exported_any())) ipc_.OwnerFreed(ptr);
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) ReportToProfiler(index, ptr, 0, *allocator);
  if (history_.active()) {
    history_.OnFreeRequested(index, ptr, 0, nullptr, {0, 0});
    history_.OnFreeCompleted(index, ptr, 0, nullptr, {0, 0});
  }
  if (!isEnabled()) {
    // Uncached: the memory goes back at once, except while a capture forbids it.
    if (absl::Status e = allocator->EmptyCache(); !e.ok() && !absl::IsFailedPrecondition(e)) {
      std::fprintf(stderr, "graphalloc: returning freed memory (caching disabled): %s\n",
                   e.ToString().c_str());
    }
  }
}

void TorchBackend::ReportToProfiler(c10::DeviceIndex device, void* ptr, std::int64_t bytes,
                                    graphalloc::CachingAllocator& allocator) {
  {
    std::lock_guard<std::mutex> lock(profiled_mu_);
    if (bytes > 0) {
      profiled_sizes_[ptr] = bytes;
    } else {
      auto it = profiled_sizes_.find(ptr);
      if (it == profiled_sizes_.end()) return;  // allocated before the profiler started: size unknown
      bytes = -it->second;
      profiled_sizes_.erase(it);
    }
  }
  const graphalloc::DeviceStats stats = allocator.GetStats();
  c10::reportMemoryUsageToProfiler(ptr, bytes, static_cast<size_t>(stats.allocated_bytes.all().current),
                                   static_cast<size_t>(stats.reserved_bytes.all().current),
                                   c10::Device(c10::DeviceType::CUDA, device));
}

void TorchBackend::ThrowOutOfMemory(const absl::Status& status, c10::DeviceIndex device, size_t size,
                                    cudaStream_t stream) {
  graphalloc::CachingAllocator& allocator = AllocatorOf(device);
  absl::StatusOr<graphalloc::MemoryInfo> info = allocator.driver().GetMemoryInfo();
  const std::size_t total = info.ok() ? info->total : allocator.driver().Info().total_memory;
  const std::size_t free = info.ok() ? info->free : 0;
  const graphalloc::DeviceStats stats = allocator.GetStats();
  const auto allocated = static_cast<std::size_t>(stats.allocated_bytes.all().current);
  const auto reserved = static_cast<std::size_t>(stats.reserved_bytes.all().current);
  // As PyTorch: observers get the size that failed, not the bytes allocated.
  history_.OnOutOfMemory(device, size, stream, size, total, free);
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "CUDA out of memory. Tried to allocate ", FormatSize(size), ". GPU ",
      static_cast<int>(device), " has a total capacity of ", FormatSize(total), " of which ",
      FormatSize(free), " is free. Of the allocated memory ", FormatSize(allocated),
      " is allocated by PyTorch, and ", FormatSize(reserved > allocated ? reserved - allocated : 0),
      " is reserved by PyTorch but unallocated (graphalloc is PyTorch's allocator). graphalloc: ",
      status.message());
}

void TorchBackend::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

// ---- Cache, statistics, limits. ----

void TorchBackend::init(int device_count) {
  device_count_.store(device_count, std::memory_order_relaxed);
  initialized_.store(true, std::memory_order_release);
}

void TorchBackend::emptyCache(c10::MempoolId_t mempool_id) {
  const bool whole_device = mempool_id.first == 0 && mempool_id.second == 0;
  // The segment_free entries of this call carry its context, as in PyTorch (history at "all" only).
  const std::shared_ptr<c10::GatheredContext> context =
      history_.active() ? history_.GatherCacheReleaseContext() : nullptr;
  for (int device = 0; device < graphalloc::kMaxDevices; ++device) {
    const auto index = static_cast<c10::DeviceIndex>(device);
    graphalloc::CachingAllocator* allocator = Existing(index);
    if (allocator == nullptr) continue;
    const c10::approx_time_t begin = c10::getApproximateTime();
    if (!whole_device) {
      pools_.EmptyCache(TorchPoolKey{index, mempool_id});
    } else {
      absl::Status s = allocator->EmptyCache();
      TORCH_CHECK(s.ok(), "graphalloc: emptyCache of CUDA device ", device, ": ", s.ToString());
    }
    if (context != nullptr) history_.OnCacheReleased(index, begin, context);
  }
}

void TorchBackend::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  // As PyTorch's allocator: memory it did not hand out (another allocator's, or none) is not its business.
  if (ptr.get() == nullptr || ptr.get_deleter() != &RawDelete) return;
  graphalloc::CachingAllocator& allocator = AllocatorOf(ptr.device().index());
  absl::Status s = allocator.RecordStream(Address(ptr.get()), graphalloc::StreamFromNative(stream.stream()));
  TORCH_CHECK(s.ok(), "graphalloc: recordStream: ", s.ToString());
}

cca::DeviceStats TorchBackend::getDeviceStats(c10::DeviceIndex device) {
  graphalloc::CachingAllocator* allocator = Existing(device);
  return allocator == nullptr ? cca::DeviceStats{} : ToTorchStats(allocator->GetStats());
}

void TorchBackend::resetAccumulatedStats(c10::DeviceIndex device) {
  if (graphalloc::CachingAllocator* allocator = Existing(device)) allocator->ResetAccumulatedStats();
}

void TorchBackend::resetPeakStats(c10::DeviceIndex device) {
  if (graphalloc::CachingAllocator* allocator = Existing(device)) allocator->ResetPeakStats();
}

double TorchBackend::getMemoryFraction(c10::DeviceIndex device) {
  return AllocatorOf(device).GetMemoryFraction();
}

void TorchBackend::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(0 <= fraction && fraction <= 1, "invalid fraction:", fraction, ". Please set within [0, 1].");
  absl::Status s = AllocatorOf(device).SetMemoryFraction(fraction);
  TORCH_CHECK(s.ok(), "graphalloc: setMemoryFraction: ", s.ToString());
}

std::vector<cca::StreamSegmentSize> TorchBackend::getExpandableSegmentSizes(c10::DeviceIndex device) {
  std::vector<cca::StreamSegmentSize> sizes;
  graphalloc::CachingAllocator* allocator = Existing(device);
  if (allocator == nullptr) return sizes;
  for (const graphalloc::SegmentSnapshot& s :
       allocator->TakeSnapshot("getExpandableSegmentSizes", /*record_event=*/false).segments) {
    if (!s.expandable) continue;
    sizes.emplace_back(static_cast<cudaStream_t>(graphalloc::NativeFromStream(graphalloc::Stream{s.stream})),
                       s.kind == graphalloc::SegmentKind::kSmall, s.ReservedBytes());
  }
  return sizes;
}

void TorchBackend::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  graphalloc::CachingAllocator& allocator = AllocatorOf(device);
  if (*largest_block == 0) {  // PyTorch's allocator starts from the device's free memory
    absl::StatusOr<graphalloc::MemoryInfo> info = allocator.driver().GetMemoryInfo();
    TORCH_CHECK(info.ok(), "graphalloc: cacheInfo: ", info.status().ToString());
    *largest_block = info->free;
  }
  // The largest contiguous free run usable as it is (mapped), as `graphalloc snapshot summary` and the
  // viewer report it: what a cuDNN workspace of that size would get. The state alone: cuDNN asks often.
  const graphalloc::SnapshotTotals totals = graphalloc::ComputeTotals(allocator.StateSnapshot());
  *largest_block = std::max<size_t>(*largest_block, totals.largest_free_block);
}

void* TorchBackend::getBaseAllocation(void* ptr, size_t* size) { return ipc_.BaseAllocation(ptr, size); }

// ---- Pools. ----

void TorchBackend::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                       std::function<bool(cudaStream_t)> filter) {
  pools_.Begin(TorchPoolKey{device, mempool_id}, std::move(filter));
}

void TorchBackend::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  pools_.End(TorchPoolKey{device, mempool_id});
}

void TorchBackend::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  pools_.Release(TorchPoolKey{device, mempool_id});
}

int TorchBackend::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  return pools_.UseCount(TorchPoolKey{device, mempool_id});
}

void TorchBackend::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                      std::shared_ptr<cca::CUDAAllocator> allocator) {
  if (allocator.get() == this) allocator = nullptr;  // graphalloc itself: the driver's memory
  pools_.CreateOrIncref(TorchPoolKey{device, mempool_id}, std::move(allocator));
}

void TorchBackend::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) {
  pools_.SetUseOnOom(TorchPoolKey{device, mempool_id}, use_on_oom);
}

void TorchBackend::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  pools_.SetNoSplit(TorchPoolKey{device, mempool_id});
}

bool TorchBackend::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                            const std::unordered_set<void*>& expected_live_allocations) {
  return pools_.CheckLiveAllocations(TorchPoolKey{device, mempool_id}, expected_live_allocations);
}

std::shared_ptr<cca::AllocatorState> TorchBackend::getCheckpointState(c10::DeviceIndex device,
                                                                      c10::MempoolId_t id) {
  return pools_.Checkpoint(TorchPoolKey{device, id});
}

cca::CheckpointDelta TorchBackend::setCheckpointPoolState(c10::DeviceIndex device,
                                                          std::shared_ptr<cca::AllocatorState> pps) {
  auto state = std::dynamic_pointer_cast<GraphallocPoolState>(pps);
  TORCH_CHECK(state != nullptr,
              "graphalloc: setCheckpointPoolState: the state was not taken by graphalloc's "
              "getCheckpointState");
  TORCH_CHECK(state->key.device == device, "graphalloc: setCheckpointPoolState: the state is of device ",
              static_cast<int>(state->key.device), ", not ", static_cast<int>(device));
  TorchPoolTable::Restored restored = pools_.Restore(*state);
  cca::CheckpointDelta delta;
  delta.ptrs_freed = std::move(restored.freed);
  delta.dataptrs_allocd.reserve(restored.allocated.size());
  for (const auto& [ptr, size] : restored.allocated) {
    delta.dataptrs_allocd.emplace_back(ptr, ptr, &RawDelete, c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

// ---- Sharing, history, peers. ----

cca::ShareableHandle TorchBackend::shareIpcHandle(void* ptr) { return ipc_.Share(ptr); }

std::shared_ptr<void> TorchBackend::getIpcDevPtr(std::string handle) { return ipc_.Open(handle); }

cca::SnapshotInfo TorchBackend::snapshot(c10::MempoolId_t mempool_id, bool include_traces) {
  std::vector<DeviceSnapshotInput> devices;
  for (int device = 0; device < graphalloc::kMaxDevices; ++device) {
    graphalloc::CachingAllocator* allocator = Existing(static_cast<c10::DeviceIndex>(device));
    if (allocator == nullptr) continue;
    const auto index = static_cast<c10::DeviceIndex>(device);
    devices.push_back(
        DeviceSnapshotInput{index, allocator->TakeSnapshot("torch"),
                            [this, index](std::uint64_t pool) { return pools_.TorchIdOf(index, pool); }});
  }
  return BuildTorchSnapshot(devices, history_, mempool_id, include_traces,
                            device_count_.load(std::memory_order_relaxed));
}

void TorchBackend::recordHistory(bool enabled, cca::CreateContextFn context_recorder,
                                 size_t alloc_trace_max_entries, cca::RecordContext when, bool clear_history,
                                 const std::vector<std::string>& skip_actions) {
  history_.Configure(enabled, context_recorder, alloc_trace_max_entries, when, clear_history, skip_actions);
  // graphalloc's own ring records the segment events (maps, unmaps, segment allocations) the snapshot adds.
  std::lock_guard<std::mutex> lock(history_mu_);
  // PyTorch's trace grows to max_entries (sys.maxsize by default); graphalloc's ring of segment events is
  // allocated whole, so it keeps at most the newest kSegmentEventRingCap of them (docs/torch_backend.md).
  history_options_ = graphalloc::HistoryOptions{
      .enabled = enabled,
      .max_entries = std::clamp<size_t>(alloc_trace_max_entries, 1, kSegmentEventRingCap),
      .stacks = false};
  for (int device = 0; device < graphalloc::kMaxDevices; ++device) {
    graphalloc::CachingAllocator* allocator = Existing(static_cast<c10::DeviceIndex>(device));
    if (allocator == nullptr) continue;
    absl::Status s = allocator->RecordHistory(history_options_);
    TORCH_CHECK(s.ok(), "graphalloc: recordHistory on CUDA device ", device, ": ", s.ToString());
  }
}

void TorchBackend::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  absl::Status s = AllocatorOf(dev_to_access).EnablePeerAccess(dev);
  TORCH_CHECK(s.ok(), "graphalloc: enablePeerAccess(", static_cast<int>(dev), ", ",
              static_cast<int>(dev_to_access), "): ", s.ToString());
}

cudaError_t TorchBackend::memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                                      size_t count, cudaStream_t stream, bool p2p_enabled) {
  // Memory mapped through the VMM API (expandable segments) is copied across devices only by the peer copy
  // unless peer access was enabled, and then graphalloc grants it on every mapping.
  if (p2p_enabled || src_device == dst_device) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

void InstallTorchBackend() {
  // PyTorch keeps the allocator in a shared_ptr; the backend outlives it (see TorchBackend::Get).
  static const std::shared_ptr<cca::CUDAAllocator> holder(&TorchBackend::Get(), [](cca::CUDAAllocator*) {});
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(holder);
  // PyTorch's device-generic entry points (torch.accelerator.memory_stats(), ...) ask c10::GetAllocator,
  // where PyTorch's own allocator is registered with a priority changeCurrentAllocator does not beat.
  c10::SetAllocator(c10::DeviceType::CUDA, &TorchBackend::Get(), std::numeric_limits<uint8_t>::max());
}

}  // namespace graphalloc_torch
