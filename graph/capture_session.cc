#include "graphalloc/graph/capture_session.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace graphalloc {

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::StatusOr<OwnedGraphExec> Instantiate(Driver& driver, const OwnedGraph& graph) {
  absl::StatusOr<GraphExec> exec = driver.GraphInstantiate(graph.get());
  if (!exec.ok()) return exec.status();
  return OwnedGraphExec(&driver, *exec);
}

absl::Status CaptureSession::Begin() {
  if (capturing_) return absl::FailedPreconditionError("CaptureSession::Begin: already capturing");
  Driver& driver = allocator_.driver();
  if (absl::Status s = driver.BeginCapture(stream_, options_.mode); !s.ok()) {
    return Annotate(s, "capture session: could not begin capturing the stream");
  }
  capturing_ = true;
  absl::StatusOr<PoolRoute> route =
      allocator_.BeginAllocateToPool(pool_, PoolRouteFilter::ForCaptureOf(stream_));
  if (!route.ok()) {
    const absl::Status cleanup = Abort();
    std::string context =
        absl::StrCat("capture session: could not route the capture's allocations to pool ", pool_.id());
    if (!cleanup.ok())
      absl::StrAppend(&context, " (ending the capture also failed: ", cleanup.message(), ")");
    return Annotate(route.status(), context);
  }
  route_ = std::move(*route);
  return absl::OkStatus();
}

absl::StatusOr<OwnedGraph> CaptureSession::End() {
  if (!capturing_) return absl::FailedPreconditionError("CaptureSession::End: not capturing");
  Driver& driver = allocator_.driver();
  capturing_ = false;
  absl::StatusOr<Graph> graph = driver.EndCapture(stream_);
  // The route ends after the capture (allocations of the capture's last work still go to the pool), and
  // also when the capture failed: the pool must not keep receiving this thread's allocations.
  const absl::Status route = route_.End();
  if (!graph.ok()) {
    return Annotate(graph.status(),
                    "capture session: the capture failed (a call the driver refuses during "
                    "capture invalidates it; see the driver's error)");
  }
  OwnedGraph owned(&driver, *graph);
  if (!route.ok()) return Annotate(route, "capture session: ending the pool route failed");
  return owned;
}

absl::Status CaptureSession::Abort() {
  absl::Status first;
  if (capturing_) {
    capturing_ = false;
    // After a failure the capture is usually invalidated, and EndCapture's error only confirms that (the
    // stream is out of capture either way, as on CUDA); a graph, if one came back, is discarded.
    absl::StatusOr<Graph> graph = allocator_.driver().EndCapture(stream_);
    if (graph.ok()) OwnedGraph discard(&allocator_.driver(), *graph);
  }
  if (route_.active()) first.Update(route_.End());
  return first;
}

absl::StatusOr<OwnedGraph> CaptureIntoPool(CachingAllocator& allocator, const PrivatePool& pool,
                                           Stream stream, absl::FunctionRef<absl::Status(Stream)> body,
                                           CaptureOptions options) {
  CaptureSession session(allocator, pool, stream, options);
  if (absl::Status s = session.Begin(); !s.ok()) return s;
  if (absl::Status s = body(stream); !s.ok()) {
    const absl::Status cleanup = session.Abort();
    std::string message = absl::StrCat("capture session: the captured function failed: ", s.message(),
                                       " (the capture was ended and its graph discarded");
    if (!cleanup.ok()) absl::StrAppend(&message, "; cleanup reported: ", cleanup.message());
    message += ")";
    return absl::Status(s.code(), message);
  }
  return session.End();
}

}  // namespace graphalloc
