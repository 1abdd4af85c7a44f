// PyTorch's allocation history for the whole process (every device): the trace entries, the contexts of live
// blocks, annotations, out-of-memory observers and trace trackers that PyTorch's CUDA caching allocator
// keeps.
#ifndef GRAPHALLOC_PYTHON_CSRC_TORCH_HISTORY_H_
#define GRAPHALLOC_PYTHON_CSRC_TORCH_HISTORY_H_

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace graphalloc_torch {

namespace cca = c10::cuda::CUDACachingAllocator;

class TorchHistory {
 public:
  TorchHistory();
  // Leaks the recorded state on purpose: contexts and callbacks hold Python objects, which must not be
  // released after the interpreter has shut down (a TorchHistory lives as long as the process).
  ~TorchHistory();
  TorchHistory(const TorchHistory&) = delete;
  TorchHistory& operator=(const TorchHistory&) = delete;

  // PyTorch's CUDAAllocator::recordHistory. `when` NEVER records no contexts; STATE keeps contexts only of
  // live blocks; ALLOC also for alloc trace entries; ALL also for frees. max_entries bounds the trace (the
  // newest kept, per device, as PyTorch does). clear drops recorded entries. skip_actions: action names
  // ("alloc", "free_requested", ...) not recorded. enabled=false stops recording and, as in PyTorch, drops
  // the trace and the annotations (the contexts of live blocks stay, for snapshots). Throws c10::Error for an
  // unknown action name or a context level without a recorder, changing nothing.
  void Configure(bool enabled, cca::CreateContextFn recorder, size_t max_entries, cca::RecordContext when,
                 bool clear, const std::vector<std::string>& skip_actions);
  bool IsEnabled() const;
  // One relaxed atomic load: true when the allocator must call OnAlloc/OnFreeRequested/OnFreeCompleted
  // (history enabled, a trace tracker attached, or contexts of live blocks still kept after history was
  // disabled: their frees must be seen so that a later block at the same address does not inherit them).
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // Called by the allocator after each successful allocation / before each free (size = rounded block size,
  // requested = what the caller asked for). Thread-safe; may be called from any thread concurrently.
  void OnAlloc(c10::DeviceIndex device, void* ptr, size_t size, size_t requested, cudaStream_t stream,
               c10::MempoolId_t pool);
  void OnFreeRequested(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                       c10::MempoolId_t pool);
  // Called when the allocator knows the free took effect (right after graphalloc's Free returned OK;
  // graphalloc may still defer reuse behind stream events, and records that completion in its own history).
  void OnFreeCompleted(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                       c10::MempoolId_t pool);
  // An allocation failed for lack of memory: records an OOM trace entry (addr_ = device_free, size_ =
  // requested) and calls every observer with (device, allocated, device_total, device_free).
  void OnOutOfMemory(c10::DeviceIndex device, size_t requested, cudaStream_t stream, size_t allocated,
                     size_t device_total, size_t device_free);

  // The allocator's own segment events (segment_free and segment_unmap) have no TorchHistory entry to take
  // a context from. PyTorch gives those of an empty_cache the context of that call (at ALL): the backend
  // gathers it (null below ALL) before the allocator's EmptyCache and reports the call after it, from
  // `begin` (taken before) to now; a snapshot gives the call's context to the device's segment events in
  // that span (the newest 64 calls are kept).
  std::shared_ptr<c10::GatheredContext> GatherCacheReleaseContext() const;
  void OnCacheReleased(c10::DeviceIndex device, c10::approx_time_t begin,
                       std::shared_ptr<c10::GatheredContext> context);
  struct CacheRelease {
    std::int64_t begin_us = 0;  // Unix microseconds, the TorchHistory's clock
    std::int64_t end_us = 0;
    std::shared_ptr<c10::GatheredContext> context;
  };
  std::vector<CacheRelease> CacheReleases(c10::DeviceIndex device) const;

  void AttachOutOfMemoryObserver(cca::OutOfMemoryObserver observer);
  // Called for every trace entry recorded here (alloc, free_requested, free_completed, oom), history on or
  // off.
  void AttachTraceTracker(cca::AllocatorTraceTracker tracker);
  // PyTorch's recordAnnotation (the snapshot's external_annotations), on the current CUDA device.
  void RecordAnnotation(const std::vector<std::pair<std::string, std::string>>& md);
  // Per thread, as in PyTorch; push and pop do nothing while history is off.
  void PushCompileContext(std::string& md);
  void PopCompileContext();
  // Per thread, as in PyTorch: the user_metadata of the trace entries the thread records.
  void SetUserMetadata(const std::string& metadata);
  std::string GetUserMetadata();

  // The context recorded for a live block, or null.
  std::shared_ptr<c10::GatheredContext> ContextOf(void* ptr) const;
  // Trace entries recorded so far for `device`, oldest first, with time_.t_ converted to Unix microseconds.
  std::vector<cca::TraceEntry> Trace(c10::DeviceIndex device) const;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> Annotations() const;

  // What a snapshot needs to cut graphalloc's own history to the span this history covers.
  struct Window {
    bool recording = false;     // history on (off, the trace is empty: disabling drops it)
    std::int64_t since_us = 0;  // Unix microseconds of the last enable or clear
    std::size_t max_entries = 1;
    std::vector<cca::TraceEntry::Action> skipped;
    bool Skips(cca::TraceEntry::Action action) const;
  };
  Window TraceWindow() const;

 private:
  struct State;
  struct LiveBlock;

  std::shared_ptr<c10::GatheredContext> Gather(cca::RecordContext level) const;
  // Under the state's mutex: appends to the device's trace (when recording and not skipped) and, when
  // trackers are attached, to `to_track`.
  void RecordLocked(cca::TraceEntry entry, std::vector<cca::TraceEntry>* to_track);
  // Under the state's mutex: the free_completed entry of a block whose free was requested.
  void CompleteLocked(void* ptr, const LiveBlock& block, c10::approx_time_t time,
                      std::vector<cca::TraceEntry>* to_track);
  void UpdateActiveLocked();

  State* const state_;  // never deleted, see the destructor
  std::atomic<bool> active_{false};
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_TORCH_HISTORY_H_
