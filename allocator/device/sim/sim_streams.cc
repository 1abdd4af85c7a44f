// SimDriver's streams and events: per-stream work queues and the engine that runs them.
//
// Every stream has a FIFO of items: closures (host functions, async copies and memsets, graph nodes),
// event-record markers and event waits. An event is complete when the marker of its latest record has run;
// one never recorded is complete. In immediate mode each enqueue runs every runnable queue on the calling
// thread before returning. In manual mode work waits until RunPendingWork / RunAllPendingWork, or a
// synchronizing call: StreamSynchronize and EventSynchronize run just what they wait for (and the streams
// that work waits on); DeviceSynchronize runs everything.
//
// A wait whose event is not complete blocks its queue: RunPendingWork stops there (the test decides what
// runs next), while a synchronizing call resolves it by running the waited-on stream up to the marker.
// Waits name a record made before them, so the dependencies form a DAG and resolution always ends.
// Closures run with the lock dropped; a closure may enqueue more work (it runs after the closure) but may
// not synchronize (CUDA_ERROR_NOT_PERMITTED, as in a CUDA host function), which would wait on itself.
#include <algorithm>
#include <utility>

#include "graphalloc/allocator/device/sim/sim_state.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace graphalloc {
namespace {

// The drivers whose closures the calling thread is running.
thread_local std::vector<const SimState*> tls_running;

class ClosureScope {
 public:
  explicit ClosureScope(const SimState* s) { tls_running.push_back(s); }
  ~ClosureScope() { tls_running.pop_back(); }
};

}  // namespace

bool SimState::InClosure() const {
  return std::find(tls_running.begin(), tls_running.end(), this) != tls_running.end();
}

SimStreamState* SimState::FindStream(Stream stream) {
  auto it = streams.find(static_cast<std::uint64_t>(stream));
  return it == streams.end() || it->second->destroyed ? nullptr : it->second.get();
}

SimEventState* SimState::FindEvent(Event event) {
  auto it = events.find(static_cast<std::uint64_t>(event));
  return it == events.end() ? nullptr : it->second.get();
}

void SimState::Push(SimStreamState& stream, SimWorkItem item) {
  if (item.kind == SimWorkItem::Kind::kRun) ++pending_runs;
  stream.queue.push_back(std::move(item));
}

absl::Status SimState::Enqueue(Stream stream, SimNodeKind kind, HostFunction fn, absl::string_view name) {
  if (!fn) return DriverError(name, DriverResult::kInvalidValue);
  auto shared = std::make_shared<const HostFunction>(std::move(fn));
  MutexLock lock(&mu);
  SimStreamState* st = FindStream(stream);
  if (st == nullptr) return DriverError(name, DriverResult::kInvalidHandle);
  if (st->capture != nullptr) return RecordNode(*st, kind, std::move(shared), name);
  Push(*st, SimWorkItem::Run(std::move(shared)));
  if (!manual) Pump();
  return absl::OkStatus();
}

std::size_t SimState::RunQueue(const std::shared_ptr<SimStreamState>& st, std::size_t max_runs,
                               bool* progress, const SimEventState* stop_event, std::uint64_t stop_gen) {
  if (st->busy) return 0;
  st->busy = true;
  std::size_t ran = 0;
  while (!st->queue.empty()) {
    if (stop_event != nullptr && stop_event->completed_gen >= stop_gen) break;
    SimWorkItem& head = st->queue.front();
    if (head.kind == SimWorkItem::Kind::kRecord) {
      head.event->completed_gen = std::max(head.event->completed_gen, head.gen);
      st->queue.pop_front();
      *progress = true;
      continue;
    }
    if (head.kind == SimWorkItem::Kind::kWait) {
      if (head.event->completed_gen < head.gen) break;
      st->queue.pop_front();
      *progress = true;
      continue;
    }
    if (ran >= max_runs) break;
    std::shared_ptr<const HostFunction> fn = std::move(head.fn);
    st->queue.pop_front();
    --pending_runs;
    *progress = true;
    progress_cv.notify_all();  // event markers may have completed
    mu.Unlock();
    {
      ClosureScope scope(this);
      (*fn)();
      fn.reset();  // the closure's captures die outside the lock too
    }
    mu.Lock();
    ++ran;
  }
  st->busy = false;
  progress_cv.notify_all();
  ReapStream(st);
  return ran;
}

std::size_t SimState::Pump() {
  std::size_t total = 0;
  bool progress = true;
  while (progress) {
    progress = false;
    std::vector<std::shared_ptr<SimStreamState>> runnable;
    for (const auto& [id, s] : streams) {
      if (!s->queue.empty() && !s->busy) runnable.push_back(s);
    }
    for (const auto& s : runnable) total += RunQueue(s, SIZE_MAX, &progress);
  }
  return total;
}

void SimState::DriveEvent(const std::shared_ptr<SimEventState>& event, std::uint64_t gen,
                          const std::weak_ptr<SimStreamState>& source) {
  while (event->completed_gen < gen) {
    std::shared_ptr<SimStreamState> src = source.lock();
    if (src == nullptr) return;  // reaped: its queue, marker included, has run
    if (src->busy) {
      SimStreamState* busy_stream = src.get();
      Await([&]()
                ABSL_NO_THREAD_SAFETY_ANALYSIS { return !busy_stream->busy || event->completed_gen >= gen; });
      continue;
    }
    bool progress = false;
    RunQueue(src, SIZE_MAX, &progress, event.get(), gen);
    if (!progress && event->completed_gen < gen) {
      if (src->queue.empty()) return;          // cannot happen: the marker is queued until it runs
      SimWorkItem& head = src->queue.front();  // a wait that blocks the marker: resolve it first
      std::shared_ptr<SimEventState> dep = head.event;
      std::weak_ptr<SimStreamState> dep_source = head.source;
      DriveEvent(dep, head.gen, dep_source);
    }
  }
}

void SimState::DriveStream(const std::shared_ptr<SimStreamState>& st) {
  while (!st->queue.empty() || st->busy) {
    if (st->busy) {
      Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !st->busy; });
      continue;
    }
    bool progress = false;
    RunQueue(st, SIZE_MAX, &progress);
    if (!progress && !st->queue.empty()) {
      SimWorkItem& head = st->queue.front();
      std::shared_ptr<SimEventState> dep = head.event;
      std::weak_ptr<SimStreamState> dep_source = head.source;
      DriveEvent(dep, head.gen, dep_source);
    }
  }
}

void SimState::DriveAll() {
  for (;;) {
    std::vector<std::shared_ptr<SimStreamState>> pending;
    for (const auto& [id, s] : streams) {
      if (!s->queue.empty() || s->busy) pending.push_back(s);
    }
    if (pending.empty()) return;
    for (const auto& s : pending) DriveStream(s);
  }
}

void SimState::ReapStream(const std::shared_ptr<SimStreamState>& st) {
  if (!st->destroyed || st->busy || !st->queue.empty()) return;
  auto it = streams.find(st->id);
  if (it != streams.end() && it->second == st) streams.erase(it);
}

// ---- SimDriver: streams. ----

absl::StatusOr<Stream> SimDriver::StreamCreate() {
  if (absl::Status st = state_->Begin(SimCall::kStreamCreate, "cuStreamCreate"); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  auto s = std::make_shared<SimStreamState>();
  s->id = state_->next_id++;
  state_->streams.emplace(s->id, s);
  return Stream{s->id};
}

absl::Status SimDriver::StreamDestroy(Stream stream) {
  constexpr absl::string_view kName = "cuStreamDestroy";
  MutexLock lock(&state_->mu);
  SimStreamState* st = stream == kDefaultStream ? nullptr : state_->FindStream(stream);
  if (st == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->capture != nullptr) {
    state_->Invalidate(*st->capture);
    return DriverError(kName, DriverResult::kStreamCaptureUnsupported);
  }
  // As CUDA: queued work still runs (RunAllPendingWork, DeviceSynchronize); the stream goes after it.
  st->destroyed = true;
  state_->ReapStream(state_->streams.at(st->id));
  return absl::OkStatus();
}

absl::Status SimDriver::StreamSynchronize(Stream stream) {
  constexpr absl::string_view kName = "cuStreamSynchronize";
  if (absl::Status st = state_->Begin(SimCall::kStreamSynchronize, kName); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  SimStreamState* st = state_->FindStream(stream);
  if (st == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->capture != nullptr) {  // illegal in every mode
    state_->Invalidate(*st->capture);
    return DriverError(kName, DriverResult::kStreamCaptureUnsupported);
  }
  if (absl::Status s = state_->RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !s.ok()) return s;
  if (state_->InClosure()) return DriverError(kName, DriverResult::kNotPermitted);
  state_->DriveStream(state_->streams.at(static_cast<std::uint64_t>(stream)));
  return absl::OkStatus();
}

absl::Status SimDriver::StreamWaitEvent(Stream stream, Event event) {
  constexpr absl::string_view kName = "cuStreamWaitEvent";
  if (absl::Status st = state_->Begin(SimCall::kStreamWaitEvent, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  SimStreamState* st = s.FindStream(stream);
  SimEventState* ev = s.FindEvent(event);
  if (st == nullptr || ev == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  std::shared_ptr<SimCapture> recorded_in;
  if (ev->capture_id != 0) {
    if (auto it = s.captures.find(ev->capture_id); it != s.captures.end()) recorded_in = it->second;
  }
  if (st->capture != nullptr || recorded_in != nullptr) return s.JoinCapture(*st, *ev, recorded_in, kName);
  if (ev->completed_gen >= ev->recorded_gen) return absl::OkStatus();
  s.Push(*st, SimWorkItem::Wait(s.events.at(static_cast<std::uint64_t>(event)), ev->recorded_gen,
                                ev->record_stream));
  if (!s.manual) s.Pump();
  return absl::OkStatus();
}

absl::Status SimDriver::LaunchHostFunction(Stream stream, HostFunction fn) {
  constexpr absl::string_view kName = "cuLaunchHostFunc";
  if (absl::Status st = state_->Begin(SimCall::kLaunchHostFunction, kName); !st.ok()) return st;
  return state_->Enqueue(stream, SimNodeKind::kHost, std::move(fn), kName);
}

absl::Status SimDriver::DeviceSynchronize() {
  constexpr absl::string_view kName = "cuCtxSynchronize";
  MutexLock lock(&state_->mu);
  // It would wait for every capturing stream too, so any live capture forbids it.
  if (absl::Status s = state_->RefuseDuringCapture(kName, SimState::Unsafe::kAnyCapture); !s.ok()) return s;
  if (state_->InClosure()) return DriverError(kName, DriverResult::kNotPermitted);
  state_->DriveAll();
  return absl::OkStatus();
}

// ---- SimDriver: events. ----

absl::StatusOr<Event> SimDriver::EventCreate() {
  if (absl::Status st = state_->Begin(SimCall::kEventCreate, "cuEventCreate"); !st.ok()) return st;
  MutexLock lock(&state_->mu);
  const std::uint64_t id = state_->next_id++;
  state_->events.emplace(id, std::make_shared<SimEventState>());
  return Event{id};
}

absl::Status SimDriver::EventDestroy(Event event) {
  std::shared_ptr<SimEventState> doomed;  // dropped after the lock
  MutexLock lock(&state_->mu);
  auto it = state_->events.find(static_cast<std::uint64_t>(event));
  if (it == state_->events.end()) return DriverError("cuEventDestroy", DriverResult::kInvalidHandle);
  doomed = std::move(it->second);
  state_->events.erase(it);
  return absl::OkStatus();
}

absl::Status SimDriver::EventRecord(Event event, Stream stream) {
  constexpr absl::string_view kName = "cuEventRecord";
  if (absl::Status st = state_->Begin(SimCall::kEventRecord, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  SimStreamState* st = s.FindStream(stream);
  SimEventState* ev = s.FindEvent(event);
  if (st == nullptr || ev == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (st->capture != nullptr) {
    SimCapture& c = *st->capture;
    if (c.status == CaptureStatus::kInvalidated)
      return DriverError(kName, DriverResult::kStreamCaptureInvalidated);
    // Not a node: inside the capture the record is only an ordering edge a later wait can join to.
    ev->capture_id = c.id;
    ev->capture_clock = c.clocks[st->id];
    return absl::OkStatus();
  }
  ev->capture_id = 0;
  ev->capture_clock.clear();
  ev->recorded_gen += 1;
  ev->record_stream = s.streams.at(st->id);
  s.Push(*st, SimWorkItem::Record(s.events.at(static_cast<std::uint64_t>(event)), ev->recorded_gen));
  if (!s.manual) s.Pump();
  return absl::OkStatus();
}

namespace {

// EventQuery / EventSynchronize on an event last recorded inside a live capture: refused whatever the
// mode, invalidating that capture.
absl::Status RefuseCapturedEvent(SimState& s, const SimEventState& ev, absl::string_view name)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (ev.capture_id == 0) return absl::OkStatus();
  auto it = s.captures.find(ev.capture_id);
  if (it == s.captures.end()) return absl::OkStatus();
  s.Invalidate(*it->second);
  return DriverError(name, DriverResult::kStreamCaptureUnsupported);
}

}  // namespace

absl::StatusOr<bool> SimDriver::EventQuery(Event event) {
  constexpr absl::string_view kName = "cuEventQuery";
  if (absl::Status st = state_->Begin(SimCall::kEventQuery, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  SimEventState* ev = s.FindEvent(event);
  if (ev == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (absl::Status st = RefuseCapturedEvent(s, *ev, kName); !st.ok()) return st;
  if (absl::Status st = s.RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok()) return st;
  return ev->completed_gen >= ev->recorded_gen;
}

absl::Status SimDriver::EventSynchronize(Event event) {
  constexpr absl::string_view kName = "cuEventSynchronize";
  if (absl::Status st = state_->Begin(SimCall::kEventSynchronize, kName); !st.ok()) return st;
  SimState& s = *state_;
  MutexLock lock(&s.mu);
  SimEventState* ev = s.FindEvent(event);
  if (ev == nullptr) return DriverError(kName, DriverResult::kInvalidHandle);
  if (absl::Status st = RefuseCapturedEvent(s, *ev, kName); !st.ok()) return st;
  if (absl::Status st = s.RefuseDuringCapture(kName, SimState::Unsafe::kGlobalOnly); !st.ok()) return st;
  if (ev->completed_gen >= ev->recorded_gen) return absl::OkStatus();
  if (s.InClosure()) return DriverError(kName, DriverResult::kNotPermitted);
  std::shared_ptr<SimEventState> keep = s.events.at(static_cast<std::uint64_t>(event));
  s.DriveEvent(keep, keep->recorded_gen, keep->record_stream);
  return absl::OkStatus();
}

// ---- SimDriver: manual completion. ----

void SimDriver::SetManualCompletion(bool manual) {
  MutexLock lock(&state_->mu);
  state_->manual = manual;
  if (!manual) state_->Pump();  // leaving manual mode: what was held back runs now
}

std::size_t SimDriver::RunPendingWork(Stream stream, std::size_t max_items) {
  MutexLock lock(&state_->mu);
  auto it = state_->streams.find(static_cast<std::uint64_t>(stream));
  if (it == state_->streams.end()) return 0;
  std::shared_ptr<SimStreamState> st = it->second;
  bool progress = false;
  return state_->RunQueue(st, max_items, &progress);
}

std::size_t SimDriver::RunAllPendingWork() {
  MutexLock lock(&state_->mu);
  return state_->Pump();
}

}  // namespace graphalloc
