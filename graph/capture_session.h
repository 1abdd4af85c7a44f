// A capture session: records what a function enqueues on one stream into a CUDA graph, with every
// allocation the capture makes routed to a private pool, and always cleans up.
//
// Order matters (the allocator's routing rule): the capture begins first, then the pool route opens (it
// reads the capture id from the stream); at the end the capture ends first, then the route. While the
// route is open the allocator is in capture mode: it queries no events, defers frees of blocks used on
// other streams until the route ends, and allocations of the capture come from the pool. If the function
// fails, or the capture is invalidated (a call CUDA forbids during capture), the session ends the capture
// and discards its graph, ends the route and reports what failed, so the stream, the allocator and the
// pool stay usable.
#ifndef GRAPHALLOC_GRAPH_CAPTURE_SESSION_H_
#define GRAPHALLOC_GRAPH_CAPTURE_SESSION_H_

#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

// A driver handle destroyed with its owner: OwnedGraph (a captured graph) and OwnedGraphExec (an
// instantiated one).
template <typename Handle, absl::Status (Driver::*kDestroy)(Handle)>
class OwnedDriverHandle {
 public:
  OwnedDriverHandle() = default;
  OwnedDriverHandle(Driver* driver, Handle handle) : driver_(driver), handle_(handle) {}
  OwnedDriverHandle(OwnedDriverHandle&& other) noexcept
      : driver_(std::exchange(other.driver_, nullptr)), handle_(other.handle_) {}
  OwnedDriverHandle& operator=(OwnedDriverHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      driver_ = std::exchange(other.driver_, nullptr);
      handle_ = other.handle_;
    }
    return *this;
  }
  ~OwnedDriverHandle() { Reset(); }

  Handle get() const { return handle_; }
  explicit operator bool() const { return driver_ != nullptr; }
  // Destroying only fails for a handle the driver does not know, which this class never holds.
  void Reset() {
    if (driver_ != nullptr) (void)(std::exchange(driver_, nullptr)->*kDestroy)(handle_);
  }

 private:
  Driver* driver_ = nullptr;
  Handle handle_{};
};

using OwnedGraph = OwnedDriverHandle<Graph, &Driver::GraphDestroy>;
using OwnedGraphExec = OwnedDriverHandle<GraphExec, &Driver::GraphExecDestroy>;

// Instantiates `graph`.
absl::StatusOr<OwnedGraphExec> Instantiate(Driver& driver, const OwnedGraph& graph);

// `status` with "`context`: " in front of its message, same code: how the graph layer says which of its
// steps a lower layer's error came from.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

struct CaptureOptions {
  // Thread-local, as PyTorch's graph trees capture: other threads (data loaders, watchdogs) may keep
  // making calls that a global-mode capture would refuse.
  CaptureMode mode = CaptureMode::kThreadLocal;
};

// The steps of a capture, for callers that need the graph and the pool route separately; CaptureIntoPool
// below is the one-call form. Not movable: it is a scope.
class CaptureSession {
 public:
  CaptureSession(CachingAllocator& allocator, const PrivatePool& pool, Stream stream,
                 CaptureOptions options = {})
      : allocator_(allocator), pool_(pool), stream_(stream), options_(options) {}
  CaptureSession(const CaptureSession&) = delete;
  CaptureSession& operator=(const CaptureSession&) = delete;
  // Abandons a capture still open (as Abort()).
  ~CaptureSession() { (void)Abort(); }

  // Begins capturing the stream, then routes the capture's allocations to the pool. On failure nothing is
  // left open.
  absl::Status Begin();
  // Ends the capture, then the route, and returns the graph. On failure (the capture was invalidated, or
  // the route's deferred frees failed) no graph is left behind and the error says which step failed.
  absl::StatusOr<OwnedGraph> End();
  // Ends whatever is open and discards the graph; for a function that failed. Returns the first cleanup
  // error (the capture and the route are ended regardless).
  absl::Status Abort();
  bool capturing() const { return capturing_; }

 private:
  CachingAllocator& allocator_;
  const PrivatePool& pool_;
  const Stream stream_;
  const CaptureOptions options_;
  bool capturing_ = false;
  PoolRoute route_;
};

// Captures what `body` enqueues on `stream` (body receives the stream) into a graph, allocations routed to
// `pool`. If `body` fails, its error is returned with the capture's cleanup status appended; the stream is
// no longer capturing and the route is closed in every case.
absl::StatusOr<OwnedGraph> CaptureIntoPool(CachingAllocator& allocator, const PrivatePool& pool,
                                           Stream stream, absl::FunctionRef<absl::Status(Stream)> body,
                                           CaptureOptions options = {});

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_CAPTURE_SESSION_H_
