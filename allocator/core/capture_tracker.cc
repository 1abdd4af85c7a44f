#include "graphalloc/allocator/core/capture_tracker.h"

namespace graphalloc {

absl::Status CaptureTracker::WaitForWorkBeforeUnmap(std::optional<Stream> stream) {
  if (underway()) return absl::AbortedError("a capture is underway: freed memory stays mapped until it ends");
  if (stream.has_value() && driver_.StreamSynchronize(*stream).ok()) return absl::OkStatus();
  return driver_.DeviceSynchronize();
}

}  // namespace graphalloc
