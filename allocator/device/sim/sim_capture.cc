// SimDriver's stream capture and graphs.
//
// A capture records every enqueue on its streams into one node list instead of running it. The list is
// kept in enqueue order, which respects every stream-order and event dependency, so a graph is replayed
// by running its nodes in order on the launch stream. Event records and waits inside a capture are not
// nodes: they only decide which streams belong to the capture (a wait on an event recorded in a capture
// joins the waiting stream to it) and whether EndCapture finds them joined back to the origin.
//
// Joining is tracked with vector clocks over work nodes: a stream's clock says how many nodes of each
// stream its next node depends on; a record snapshots the recording stream's clock and a wait merges it.
// EndCapture requires the origin's clock to cover every node of every joined stream
// (CUDA_ERROR_STREAM_CAPTURE_UNJOINED otherwise). Refused calls invalidate the capture, which stays
// "capturing" (status kInvalidated, enqueues fail) until EndCapture returns CAPTURE_INVALIDATED.
#include <utility>

#include "graphalloc/allocator/device/sim/sim_state.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

// The calling thread's capture mode (ExchangeCaptureMode), per thread as CUDA keeps it.
thread_local CaptureMode thread_capture_mode = CaptureMode::kGlobal;

void MergeClock(absl::flat_hash_map<std::uint64_t, std::uint64_t>& into,
                const absl::flat_hash_map<std::uint64_t, std::uint64_t>& from) {
  for (const auto& [stream, n] : from) {
    std::uint64_t& mine = into[stream];
    mine = std::max(mine, n);
  }
}

}  // namespace

void SimState::Invalidate(SimCapture& capture) { capture.status = CaptureStatus::kInvalidated; }

absl::Status SimState::RefuseDuringCapture(absl::string_view name, Unsafe what) {
  const std::thread::id me = std::this_thread::get_id();
  bool refused = false;
  const CaptureMode mine = thread_capture_mode;
  if (what == Unsafe::kGlobalOnly && mine == CaptureMode::kRelaxed) return absl::OkStatus();
  for (const auto& [id, c] : captures) {
    // A global-mode thread is bound by every global capture and its own thread-local ones; a
    // thread-local-mode thread only by its own captures.
    const bool own = c->thread == me && c->mode != CaptureMode::kRelaxed;
    const bool forbids = what == Unsafe::kAnyCapture || own ||
                         (mine == CaptureMode::kGlobal && c->mode == CaptureMode::kGlobal);
    if (forbids) {
      Invalidate(*c);
      refused = true;
    }
  }
  return refused ? DriverError(name, DriverResult::kStreamCaptureUnsupported) : absl::OkStatus();
}

absl::Status SimState::RecordNode(SimStreamState& stream, SimNodeKind kind,
                                  std::shared_ptr<const HostFunction> fn, absl::string_view name) {
  SimCapture& c = *stream.capture;
  if (c.status == CaptureStatus::kInvalidated)
    return DriverError(name, DriverResult::kStreamCaptureInvalidated);
  c.nodes.push_back(SimNode{.kind = kind, .fn = std::move(fn)});
  c.clocks[stream.id][stream.id] = ++c.work_count[stream.id];
  return absl::OkStatus();
}

absl::Status SimState::JoinCapture(SimStreamState& stream, const SimEventState& event,
                                   const std::shared_ptr<SimCapture>& recorded_in, absl::string_view name) {
  if (stream.capture != nullptr) {
    SimCapture& c = *stream.capture;
    if (c.status == CaptureStatus::kInvalidated) {
      return DriverError(name, DriverResult::kStreamCaptureInvalidated);
    }
    if (recorded_in == nullptr) {
      // Waiting on uncaptured work would make the graph depend on something outside it.
      Invalidate(c);
      return DriverError(name, DriverResult::kStreamCaptureIsolation);
    }
    if (recorded_in.get() != &c) {
      Invalidate(c);
      Invalidate(*recorded_in);
      return DriverError(name, DriverResult::kStreamCaptureMerge);
    }
    MergeClock(c.clocks[stream.id], event.capture_clock);
    return absl::OkStatus();
  }
  if (recorded_in->status == CaptureStatus::kInvalidated) {
    return DriverError(name, DriverResult::kStreamCaptureInvalidated);
  }
  if (stream.id == 0) {  // the legacy stream can never be part of a capture
    Invalidate(*recorded_in);
    return DriverError(name, DriverResult::kStreamCaptureUnsupported);
  }
  stream.capture = recorded_in;
  MergeClock(recorded_in->clocks[stream.id], event.capture_clock);
  return absl::OkStatus();
}

absl::Status SimDriver::BeginCapture(Stream stream, CaptureMode mode) {
  constexpr absl::string_view kName = "cuStreamBeginCapture";
  if (absl::Status st = state_->Begin(SimCall::kBeginCapture, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  SimStreamState* st = s.FindStream(stream);
  if (st == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->id == 0 || st->capture != nullptr)
    return DriverError(kName, DriverResult::kStreamCaptureUnsupported);
  auto c = std::make_shared<SimCapture>();
  c->id = s.next_capture_id++;
  c->mode = mode;
  c->origin = st->id;
  c->thread = std::this_thread::get_id();
  c->clocks[st->id];
  s.captures.emplace(c->id, c);
  st->capture = std::move(c);
  return absl::OkStatus();
}

absl::StatusOr<Graph> SimDriver::EndCapture(Stream stream) {
  constexpr absl::string_view kName = "cuStreamEndCapture";
  if (absl::Status st = state_->Begin(SimCall::kEndCapture, kName); !st.ok()) return st;
  SimState& s = *state_;
  std::shared_ptr<SimCapture> ended;  // declared before the lock: its closures die after the unlock
  MutexLock lock(&s.mu);
  SimStreamState* st = s.FindStream(stream);
  if (st == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->capture == nullptr) return DriverError(kName, DriverResult::kInvalidValue);
  SimCapture& c = *st->capture;
  if (c.origin != st->id) {
    s.Invalidate(c);
    return DriverError(kName, DriverResult::kStreamCaptureUnmatched);
  }
  if (c.mode == CaptureMode::kThreadLocal && c.thread != std::this_thread::get_id()) {
    return DriverError(kName, DriverResult::kStreamCaptureWrongThread);
  }
  ended = st->capture;
  for (auto& [id, other] : s.streams) {
    if (other->capture == ended) other->capture.reset();
  }
  s.captures.erase(ended->id);
  if (ended->status == CaptureStatus::kInvalidated) {
    return DriverError(kName, DriverResult::kStreamCaptureInvalidated);
  }
  const auto& origin_clock = ended->clocks[ended->origin];
  for (const auto& [other, n] : ended->work_count) {
    auto it = origin_clock.find(other);
    if (other != ended->origin && (it == origin_clock.end() || it->second < n)) {
      return DriverError(kName, DriverResult::kStreamCaptureUnjoined);
    }
  }
  const std::uint64_t id = s.next_id++;
  s.graphs.emplace(id, SimGraphState{.nodes = std::move(ended->nodes)});
  return Graph{id};
}

absl::StatusOr<CaptureMode> SimDriver::ExchangeCaptureMode(CaptureMode mode) {
  const CaptureMode previous = thread_capture_mode;
  thread_capture_mode = mode;
  return previous;
}

absl::StatusOr<CaptureInfo> SimDriver::GetCaptureInfo(Stream stream) {
  MutexLock lock(&state_->mu);
  SimStreamState* st = state_->FindStream(stream);
  if (st == nullptr) return DriverError("cuStreamGetCaptureInfo", DriverResult::kInvalidHandle);
  if (st->capture == nullptr) return CaptureInfo{};
  return CaptureInfo{.status = st->capture->status, .id = st->capture->id};
}

// ---- Graphs. ----

absl::StatusOr<GraphExec> SimDriver::GraphInstantiate(Graph graph) {
  constexpr absl::string_view kName = "cuGraphInstantiate";
  if (absl::Status st = state_->Begin(SimCall::kGraphInstantiate, kName); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  auto it = state_->graphs.find(static_cast<std::uint64_t>(graph));
  if (it == state_->graphs.end()) return DriverError(kName, DriverResult::kInvalidHandle);
  const std::uint64_t id = state_->next_id++;
  state_->execs.emplace(id, it->second);  // its own node list: the graph may go first
  return GraphExec{id};
}

absl::StatusOr<GraphUpdateResult> SimDriver::GraphExecUpdate(GraphExec exec, Graph graph) {
  constexpr absl::string_view kName = "cuGraphExecUpdate";
  if (absl::Status st = state_->Begin(SimCall::kGraphExecUpdate, kName); !st.ok()) return st;
  std::vector<SimNode> old;  // replaced closures die after the unlock
  MutexLock lock(&state_->mu);
  auto e = state_->execs.find(static_cast<std::uint64_t>(exec));
  auto g = state_->graphs.find(static_cast<std::uint64_t>(graph));
  if (e == state_->execs.end() || g == state_->graphs.end())
    return DriverError(kName, DriverResult::kInvalidHandle);
  const std::vector<SimNode>& fresh = g->second.nodes;
  std::vector<SimNode>& nodes = e->second.nodes;
  if (fresh.size() != nodes.size()) return GraphUpdateResult::kTopologyChanged;
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    if (fresh[i].kind != nodes[i].kind) return GraphUpdateResult::kTopologyChanged;
  }
  // Launches already queued keep the functions they were given; the next launch runs the new ones.
  old = std::exchange(nodes, fresh);
  return GraphUpdateResult::kSuccess;
}

absl::Status SimDriver::GraphLaunch(GraphExec exec, Stream stream) {
  constexpr absl::string_view kName = "cuGraphLaunch";
  if (absl::Status st = state_->Begin(SimCall::kGraphLaunch, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  auto e = s.execs.find(static_cast<std::uint64_t>(exec));
  SimStreamState* st = s.FindStream(stream);
  if (e == s.execs.end() || st == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->capture != nullptr) {
    // Launching into a capture records the whole graph as one child-graph node.
    auto child = std::make_shared<const HostFunction>([nodes = e->second.nodes] {
      for (const SimNode& n : nodes) (*n.fn)();
    });
    return s.RecordNode(*st, SimNodeKind::kChildGraph, std::move(child), kName);
  }
  for (const SimNode& n : e->second.nodes) s.Push(*st, SimWorkItem::Run(n.fn));
  if (!s.manual) s.Pump();
  return absl::OkStatus();
}

absl::Status SimDriver::GraphExecDestroy(GraphExec exec) {
  SimGraphState doomed;
  MutexLock lock(&state_->mu);
  auto it = state_->execs.find(static_cast<std::uint64_t>(exec));
  if (it == state_->execs.end()) return DriverError("cuGraphExecDestroy", DriverResult::kInvalidHandle);
  doomed = std::move(it->second);
  state_->execs.erase(it);
  return absl::OkStatus();
}

absl::Status SimDriver::GraphDestroy(Graph graph) {
  SimGraphState doomed;
  MutexLock lock(&state_->mu);
  auto it = state_->graphs.find(static_cast<std::uint64_t>(graph));
  if (it == state_->graphs.end()) return DriverError("cuGraphDestroy", DriverResult::kInvalidHandle);
  doomed = std::move(it->second);
  state_->graphs.erase(it);
  return absl::OkStatus();
}

}  // namespace graphalloc
