// graphalloc as PyTorch's CUDA allocator: a complete c10::cuda::CUDACachingAllocator::CUDAAllocator whose
// every method is served by graphalloc's process-wide allocators (allocator/core/default_allocator.h), the
// same ones graphalloc's C ABI and Python package report on.
//
// What PyTorch sees: tensors' DataPtrs free into graphalloc; memory_stats(), empty_cache(), memory
// fractions, record_stream, cudnn's cacheInfo are graphalloc's; CUDA graph and MemPool pools are graphalloc
// private pools (torch_pools.h), whose checkpoint and restore serve torch.compile's CUDA graph trees, with
// expandable segments too; _record_memory_history() and _snapshot() record and report in PyTorch's own
// structures (torch_history.h, torch_snapshot.h), so memory_viz works unchanged; an allocation that does
// not fit raises torch.cuda.OutOfMemoryError with graphalloc's figures; torch.multiprocessing shares CUDA
// tensors, expandable segments included (torch_ipc.h).
//
// One instance per process, installed by InstallTorchBackend() before CUDA is initialised and never
// destroyed (tensors may be freed during interpreter exit).
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_BACKEND_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_BACKEND_H_

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "python/csrc/torch_history.h"
#include "python/csrc/torch_ipc.h"
#include "python/csrc/torch_pools.h"

namespace graphalloc_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

class TorchBackend final : public cca::CUDAAllocator {
 public:
  // The process's backend, created on first call.
  static TorchBackend& Get();

  // The most segment events graphalloc's own history ring keeps for a recordHistory (2^18, some 15 MB).
  static constexpr size_t kSegmentEventRingCap = size_t{1} << 18;

  // ---- c10::Allocator / DeviceAllocator ----
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override { return &RawDelete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;
  bool initialized() override { return initialized_.load(std::memory_order_acquire); }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  cca::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // ---- CUDAAllocator ----
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override { RawDelete(ptr); }
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex device) override;
  // Without caching (enable(false), PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING semantics) every free also
  // returns the device's unused memory, as cudaFree would.
  void enable(bool value) override { enabled_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return enabled_.load(std::memory_order_relaxed); }
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;
  using cca::CUDAAllocator::recordStream;
  cca::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0}, bool include_traces = true) override;

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<cca::CUDAAllocator> allocator = nullptr) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;

  cca::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;

  bool isHistoryEnabled() override { return history_.IsEnabled(); }
  void recordHistory(bool enabled, cca::CreateContextFn context_recorder, size_t alloc_trace_max_entries,
                     cca::RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    history_.RecordAnnotation(md);
  }
  void pushCompileContext(std::string& md) override { history_.PushCompileContext(md); }
  void popCompileContext() override { history_.PopCompileContext(); }
  void setUserMetadata(const std::string& metadata) override { history_.SetUserMetadata(metadata); }
  std::string getUserMetadata() override { return history_.GetUserMetadata(); }
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    history_.AttachOutOfMemoryObserver(std::move(observer));
  }
  void attachAllocatorTraceTracker(cca::AllocatorTraceTracker tracker) override {
    history_.AttachTraceTracker(std::move(tracker));
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::string name() override { return "graphalloc"; }

  TorchPoolTable& pools() { return pools_; }

 private:
  TorchBackend();

  // The device's graphalloc allocator, created on first use (with the history settings in force); throws
  // c10::Error when it cannot be created.
  graphalloc::CachingAllocator& AllocatorOf(c10::DeviceIndex device);
  // The allocator of `device` if it exists, else nullptr; never creates one.
  static graphalloc::CachingAllocator* Existing(c10::DeviceIndex device);
  // Memory for `size` bytes on `stream`; throws c10::OutOfMemoryError (or c10::Error) on failure.
  void* Allocate(size_t size, c10::DeviceIndex device, cudaStream_t stream);
  // Every DataPtr's deleter: frees into the allocator that owns `ptr`; errors go to stderr (it runs in
  // destructors).
  static void RawDelete(void* ptr);
  void Free(void* ptr);
  [[noreturn]] void ThrowOutOfMemory(const absl::Status& status, c10::DeviceIndex device, size_t size,
                                     cudaStream_t stream);

  // torch.profiler(profile_memory=True) reports each allocation and free with its size; a free knows only
  // its pointer, so while the profiler records, the sizes of blocks allocated meanwhile are kept here.
  void ReportToProfiler(c10::DeviceIndex device, void* ptr, std::int64_t bytes,
                        graphalloc::CachingAllocator& allocator);
  std::mutex profiled_mu_;
  std::unordered_map<void*, std::int64_t> profiled_sizes_;

  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
  std::atomic<int> device_count_{0};
  // The graphalloc history settings recordHistory() asked for, applied to allocators created later too.
  std::mutex history_mu_;
  graphalloc::HistoryOptions history_options_;
  TorchPoolTable pools_;
  TorchIpc ipc_;
  TorchHistory history_;
};

// Makes the backend PyTorch's CUDA allocator. Throws c10::Error when PyTorch refuses (CUDA was already
// initialised, so its allocator has handed out memory).
void InstallTorchBackend();

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_BACKEND_H_
