// Whether a CUDA graph capture is underway in one allocator (a capture route is open, see
// CachingAllocator::BeginAllocateToPool), and the gate that orders captures against synchronizations.
//
// While a capture is underway the allocator must not query or synchronize events, synchronize the device
// or free device memory: each would break the capture. A release that must wait for the device first
// takes the gate, checks that no capture is underway and synchronizes and unmaps under it; a capture is
// counted only under the gate, so none begins in between.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_CAPTURE_TRACKER_H_
#define GRAPHALLOC_ALLOCATOR_CORE_CAPTURE_TRACKER_H_

#include <atomic>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class CaptureTracker {
 public:
  explicit CaptureTracker(Driver& driver) : driver_(driver) {}

  bool underway(std::memory_order order = std::memory_order_acquire) const { return count_.load(order) > 0; }
  // A capture route opens (under the gate).
  void Begin() {
    MutexLock gate(&gate_);
    count_.fetch_add(1, std::memory_order_release);
  }
  // A capture route ends; true when it was the last.
  bool End() { return count_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

  Mutex& gate() ABSL_LOCK_RETURNED(gate_) { return gate_; }
  // Before memory of freed blocks is unmapped (or freed): waits for the work queued before those frees (a
  // free is stream-ordered, an unmap is not), on `stream`, or the whole device for nullopt or a stream the
  // driver does not know. Aborted, waiting for nothing, while a capture is underway (a synchronization
  // would break it; no driver error maps to Aborted). The caller holds the gate through its unmaps.
  absl::Status WaitForWorkBeforeUnmap(std::optional<Stream> stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(gate_);

 private:
  Driver& driver_;
  std::atomic<int> count_{0};  // open capture routes
  Mutex gate_;                 // taken with no other allocator lock held
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_CAPTURE_TRACKER_H_
