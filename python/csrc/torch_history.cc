// TorchHistory of torch_history.h.
#include "python/csrc/torch_history.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "graphalloc/allocator/history/history_ring.h"

namespace graphalloc_torch {
namespace {

using TraceEntry = cca::TraceEntry;
using AnnotationEntry = c10::CachingDeviceAllocator::AnnotationEntry;
using Trackers = std::vector<cca::AllocatorTraceTracker>;
using Observers = std::vector<cca::OutOfMemoryObserver>;

// Per thread and shared by every device, as PyTorch keeps them.
thread_local std::vector<std::string> tls_compile_context;
thread_local std::string tls_user_metadata;

std::string CurrentCompileContext() {
  return tls_compile_context.empty() ? std::string("N/A") : tls_compile_context.back();
}

// A callback's exception must not unwind into the allocator (it would leak the block being handed out or
// leave a free half done); the first one is reported so that a broken callback is not silent.
void ReportCallbackError(const char* kind, const char* what) {
  static std::atomic<bool> reported{false};
  if (!reported.exchange(true)) {
    std::fprintf(stderr, "graphalloc: a %s threw an exception, ignored (later ones are not reported): %s\n",
                 kind, what);
  }
}

template <typename F>
void CallSafely(const char* kind, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    ReportCallbackError(kind, e.what());
  } catch (...) {
    ReportCallbackError(kind, "unknown exception");
  }
}

bool AtLeast(cca::RecordContext when, cca::RecordContext level) {
  return static_cast<int>(when) >= static_cast<int>(level);
}

}  // namespace

struct TorchHistory::LiveBlock {
  c10::DeviceIndex device = 0;
  cudaStream_t stream = nullptr;
  c10::MempoolId_t pool{0, 0};
  std::size_t requested = 0;
  std::shared_ptr<c10::GatheredContext> context;       // where it was allocated (STATE and above)
  std::shared_ptr<c10::GatheredContext> free_context;  // where it was freed (ALL)
  bool freeing = false;                                // free requested, completion not yet reported
};

struct TorchHistory::State {
  // A bounded buffer keeping the newest entries, as PyTorch's trace ring does.
  template <typename T>
  class Ring {
   public:
    void SetCapacity(std::size_t capacity) {
      capacity = std::max<std::size_t>(1, capacity);
      if (capacity == capacity_) return;
      std::vector<T> items = Items();
      if (items.size() > capacity)
        items.erase(items.begin(), items.end() - static_cast<std::ptrdiff_t>(capacity));
      items_ = std::move(items);
      next_ = 0;  // items_ is oldest first again, so when full the oldest is at 0
      capacity_ = capacity;
    }
    void Push(T item) {
      if (items_.size() < capacity_) {
        items_.push_back(std::move(item));
        return;
      }
      items_[next_] = std::move(item);
      next_ = (next_ + 1) % capacity_;
    }
    // Oldest first.
    std::vector<T> Items() const {
      std::vector<T> out;
      out.reserve(items_.size());
      const auto split = items_.begin() + static_cast<std::ptrdiff_t>(next_);
      out.insert(out.end(), split, items_.end());
      out.insert(out.end(), items_.begin(), split);
      return out;
    }
    void Clear() {
      items_.clear();
      items_.shrink_to_fit();
      next_ = 0;
    }

   private:
    std::vector<T> items_;
    std::size_t next_ = 0;  // the oldest entry once full (0 until then)
    std::size_t capacity_ = 1;
  };

  mutable std::mutex mu;
  // Read without `mu` before it is taken (gathering a context may take the GIL, which must not happen under
  // `mu`); written under it.
  std::atomic<bool> enabled{false};
  std::atomic<cca::CreateContextFn> recorder{nullptr};
  std::atomic<cca::RecordContext> when{cca::RecordContext::NEVER};

  std::size_t max_entries = 1;
  std::vector<TraceEntry::Action> skipped;
  c10::approx_time_t since = 0;          // the last enable or clear
  std::vector<Ring<TraceEntry>> traces;  // by device
  Ring<AnnotationEntry> annotations;
  struct Release {
    c10::DeviceIndex device = 0;
    c10::approx_time_t begin = 0;
    c10::approx_time_t end = 0;
    std::shared_ptr<c10::GatheredContext> context;
  };
  Ring<Release> releases;  // capacity kCacheReleasesKept, set by the constructor
  std::unordered_map<void*, LiveBlock> live;
  // Replaced, never changed in place, so that a copy of the pointer can be called with `mu` released.
  std::shared_ptr<const Trackers> trackers = std::make_shared<const Trackers>();
  std::shared_ptr<const Observers> observers = std::make_shared<const Observers>();
  mutable c10::ApproximateClockToUnixTimeConverter clock;
};

bool TorchHistory::Window::Skips(cca::TraceEntry::Action action) const {
  return std::find(skipped.begin(), skipped.end(), action) != skipped.end();
}

constexpr std::size_t kCacheReleasesKept = 64;

TorchHistory::TorchHistory() : state_(new State) { state_->releases.SetCapacity(kCacheReleasesKept); }

TorchHistory::~TorchHistory() = default;

void TorchHistory::Configure(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                             cca::RecordContext when, bool clear,
                             const std::vector<std::string>& skip_actions) {
  TORCH_CHECK(when == cca::RecordContext::NEVER || recorder != nullptr,
              "recordHistory: recording contexts needs a context recorder");
  std::vector<TraceEntry::Action> skipped;
  for (const std::string& name : skip_actions) {
    skipped.push_back(c10::CachingDeviceAllocator::parseTraceEntryAction(name));  // throws for unknown names
  }
  const c10::approx_time_t now = c10::getApproximateTime();
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  const bool was_enabled = s.enabled.load(std::memory_order_relaxed);
  s.enabled.store(enabled, std::memory_order_relaxed);
  s.recorder.store(enabled ? recorder : nullptr, std::memory_order_relaxed);
  s.when.store(enabled ? when : cca::RecordContext::NEVER, std::memory_order_relaxed);
  s.max_entries = std::max<std::size_t>(1, max_entries);
  for (State::Ring<TraceEntry>& ring : s.traces) ring.SetCapacity(s.max_entries);
  s.annotations.SetCapacity(s.max_entries);
  s.skipped = std::move(skipped);
  if (!enabled || clear) {
    for (State::Ring<TraceEntry>& ring : s.traces) ring.Clear();
    s.annotations.Clear();
    s.releases.Clear();
    s.since = now;
  } else if (!was_enabled) {
    s.since = now;
  }
  if (!enabled && s.trackers->empty()) {
    // Nothing records any more: only the contexts of live blocks are still wanted (by snapshots).
    for (auto it = s.live.begin(); it != s.live.end();) {
      it = it->second.context == nullptr ? s.live.erase(it) : std::next(it);
    }
  }
  UpdateActiveLocked();
}

bool TorchHistory::IsEnabled() const { return state_->enabled.load(std::memory_order_relaxed); }

std::shared_ptr<c10::GatheredContext> TorchHistory::Gather(cca::RecordContext level) const {
  if (!AtLeast(state_->when.load(std::memory_order_relaxed), level)) return nullptr;
  const cca::CreateContextFn recorder = state_->recorder.load(std::memory_order_relaxed);
  if (recorder == nullptr) return nullptr;
  std::shared_ptr<c10::GatheredContext> context;
  CallSafely("context recorder", [&] { context = recorder(); });
  return context;
}

void TorchHistory::RecordLocked(TraceEntry entry, std::vector<TraceEntry>* to_track) {
  State& s = *state_;
  if (!s.trackers->empty()) to_track->push_back(entry);
  if (!s.enabled.load(std::memory_order_relaxed) || entry.device_ < 0) return;
  if (std::find(s.skipped.begin(), s.skipped.end(), entry.action_) != s.skipped.end()) return;
  const auto device = static_cast<std::size_t>(entry.device_);
  while (s.traces.size() <= device) {
    s.traces.emplace_back().SetCapacity(s.max_entries);
  }
  s.traces[device].Push(std::move(entry));
}

void TorchHistory::CompleteLocked(void* ptr, const LiveBlock& block, c10::approx_time_t time,
                                  std::vector<TraceEntry>* to_track) {
  State& s = *state_;
  if (!s.enabled.load(std::memory_order_relaxed) && s.trackers->empty()) return;
  std::shared_ptr<c10::GatheredContext> context = block.free_context;
  if (context == nullptr && AtLeast(s.when.load(std::memory_order_relaxed), cca::RecordContext::ALLOC)) {
    context = block.context;
  }
  RecordLocked(TraceEntry(TraceEntry::FREE_COMPLETED, block.device, reinterpret_cast<std::uintptr_t>(ptr),
                          block.requested, block.stream, block.pool, time, std::move(context),
                          CurrentCompileContext(), tls_user_metadata),
               to_track);
}

void TorchHistory::UpdateActiveLocked() {
  const State& s = *state_;
  active_.store(s.enabled.load(std::memory_order_relaxed) || !s.trackers->empty() || !s.live.empty(),
                std::memory_order_relaxed);
}

namespace {

void CallTrackers(const std::shared_ptr<const Trackers>& trackers, const std::vector<TraceEntry>& entries) {
  for (const TraceEntry& entry : entries) {
    for (const cca::AllocatorTraceTracker& tracker : *trackers) {
      CallSafely("trace tracker", [&] { tracker(entry); });
    }
  }
}

}  // namespace

void TorchHistory::OnAlloc(c10::DeviceIndex device, void* ptr, size_t /*size*/, size_t requested,
                           cudaStream_t stream, c10::MempoolId_t pool) {
  // The time first: a snapshot pairs this entry with graphalloc's own record of the allocation by time.
  const c10::approx_time_t time = c10::getApproximateTime();
  std::shared_ptr<c10::GatheredContext> context = Gather(cca::RecordContext::STATE);
  std::vector<TraceEntry> to_track;
  std::shared_ptr<const Trackers> trackers;
  {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    // Active only for the contexts still kept from when history was on: nothing to record.
    if (!s.enabled.load(std::memory_order_relaxed) && s.trackers->empty()) return;
    auto [it, inserted] = s.live.try_emplace(ptr);
    LiveBlock& block = it->second;
    if (!inserted && block.freeing) {
      // The previous block here was freed and handed out again (on another thread) before its
      // OnFreeCompleted arrived: complete it first, so that the trace stays in order for this address.
      CompleteLocked(ptr, block, time, &to_track);
    }
    block = LiveBlock{device, stream, pool, requested, context, nullptr, false};
    const bool keep = AtLeast(s.when.load(std::memory_order_relaxed), cca::RecordContext::ALLOC);
    RecordLocked(
        TraceEntry(TraceEntry::ALLOC, device, reinterpret_cast<std::uintptr_t>(ptr), requested, stream, pool,
                   time, keep ? std::move(context) : nullptr, CurrentCompileContext(), tls_user_metadata),
        &to_track);
    UpdateActiveLocked();
    trackers = s.trackers;
  }
  CallTrackers(trackers, to_track);
}

void TorchHistory::OnFreeRequested(c10::DeviceIndex device, void* ptr, size_t size, cudaStream_t stream,
                                   c10::MempoolId_t pool) {
  const c10::approx_time_t time = c10::getApproximateTime();
  std::shared_ptr<c10::GatheredContext> free_context = Gather(cca::RecordContext::ALL);
  std::vector<TraceEntry> to_track;
  std::shared_ptr<const Trackers> trackers;
  {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.live.find(ptr);
    if (!s.enabled.load(std::memory_order_relaxed) && s.trackers->empty()) {
      // Nothing records; a kept context goes once the free completes.
      if (it != s.live.end()) it->second.freeing = true;
      return;
    }
    if (it == s.live.end()) {
      // Allocated before recording began: the requested size is unknown, the block's size stands in.
      it = s.live.try_emplace(ptr, LiveBlock{device, stream, pool, size, nullptr, nullptr, false}).first;
    }
    LiveBlock& block = it->second;
    block.freeing = true;
    block.free_context = free_context;
    std::shared_ptr<c10::GatheredContext> context = std::move(free_context);
    if (context == nullptr && AtLeast(s.when.load(std::memory_order_relaxed), cca::RecordContext::ALLOC)) {
      context = block.context;
    }
    RecordLocked(
        TraceEntry(TraceEntry::FREE_REQUESTED, device, reinterpret_cast<std::uintptr_t>(ptr), block.requested,
                   stream, pool, time, std::move(context), CurrentCompileContext(), tls_user_metadata),
        &to_track);
    UpdateActiveLocked();
    trackers = s.trackers;
  }
  CallTrackers(trackers, to_track);
}

void TorchHistory::OnFreeCompleted(c10::DeviceIndex /*device*/, void* ptr, size_t /*size*/,
                                   cudaStream_t /*stream*/, c10::MempoolId_t /*pool*/) {
  const c10::approx_time_t time = c10::getApproximateTime();
  std::vector<TraceEntry> to_track;
  std::shared_ptr<const Trackers> trackers;
  {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.live.find(ptr);
    // Not freeing: unknown, or already completed by a new allocation at this address (see OnAlloc).
    if (it == s.live.end() || !it->second.freeing) return;
    CompleteLocked(ptr, it->second, time, &to_track);
    s.live.erase(it);
    UpdateActiveLocked();
    trackers = s.trackers;
  }
  CallTrackers(trackers, to_track);
}

void TorchHistory::OnOutOfMemory(c10::DeviceIndex device, size_t requested, cudaStream_t stream,
                                 size_t allocated, size_t device_total, size_t device_free) {
  const c10::approx_time_t time = c10::getApproximateTime();
  // Only trace entries keep an OOM's context, and only from ALLOC on: no point gathering it otherwise.
  std::shared_ptr<c10::GatheredContext> context = Gather(cca::RecordContext::ALLOC);
  std::vector<TraceEntry> to_track;
  std::shared_ptr<const Trackers> trackers;
  std::shared_ptr<const Observers> observers;
  {
    State& s = *state_;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.enabled.load(std::memory_order_relaxed) || !s.trackers->empty()) {
      RecordLocked(TraceEntry(TraceEntry::OOM, device, device_free, requested, stream, c10::MempoolId_t{0, 0},
                              time, std::move(context), CurrentCompileContext(), tls_user_metadata),
                   &to_track);
    }
    trackers = s.trackers;
    observers = s.observers;
  }
  CallTrackers(trackers, to_track);
  for (const cca::OutOfMemoryObserver& observer : *observers) {
    CallSafely("out-of-memory observer", [&] { observer(device, allocated, device_total, device_free); });
  }
}

std::shared_ptr<c10::GatheredContext> TorchHistory::GatherCacheReleaseContext() const {
  return Gather(cca::RecordContext::ALL);
}

void TorchHistory::OnCacheReleased(c10::DeviceIndex device, c10::approx_time_t begin,
                                   std::shared_ptr<c10::GatheredContext> context) {
  if (context == nullptr) return;
  const c10::approx_time_t end = c10::getApproximateTime();
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.enabled.load(std::memory_order_relaxed)) return;
  s.releases.Push(State::Release{device, begin, end, std::move(context)});
}

std::vector<TorchHistory::CacheRelease> TorchHistory::CacheReleases(c10::DeviceIndex device) const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<CacheRelease> out;
  const std::vector<State::Release> releases = s.releases.Items();
  if (releases.empty()) return out;
  const auto to_ns = s.clock.makeConverter();
  for (const State::Release& r : releases) {
    if (r.device != device) continue;
    out.push_back(CacheRelease{to_ns(r.begin) / 1000, to_ns(r.end) / 1000, r.context});
  }
  return out;
}

void TorchHistory::AttachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto observers = std::make_shared<Observers>(*s.observers);
  observers->push_back(std::move(observer));
  s.observers = std::move(observers);
}

void TorchHistory::AttachTraceTracker(cca::AllocatorTraceTracker tracker) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto trackers = std::make_shared<Trackers>(*s.trackers);
  trackers->push_back(std::move(tracker));
  s.trackers = std::move(trackers);
  UpdateActiveLocked();
}

void TorchHistory::RecordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) {
  if (!IsEnabled()) return;
  AnnotationEntry entry(c10::cuda::current_device(), c10::getApproximateTime());
  for (const auto& [name, value] : md) entry.recordUserMetadata(name, value);
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.enabled.load(std::memory_order_relaxed)) s.annotations.Push(std::move(entry));
}

void TorchHistory::PushCompileContext(std::string& md) {
  if (!IsEnabled()) return;
  tls_compile_context.push_back(md);
}

void TorchHistory::PopCompileContext() {
  if (!IsEnabled() || tls_compile_context.empty()) return;
  tls_compile_context.pop_back();
}

void TorchHistory::SetUserMetadata(const std::string& metadata) {
  tls_user_metadata = metadata;
  // The events graphalloc records itself on this thread (segment events, free_completed) carry it too:
  // PyTorch gives every trace entry the metadata of the thread that records it.
  graphalloc::SetThreadAnnotation(metadata);
}

std::string TorchHistory::GetUserMetadata() { return tls_user_metadata; }

std::shared_ptr<c10::GatheredContext> TorchHistory::ContextOf(void* ptr) const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.find(ptr);
  // A block whose free was requested is not live; its address may already belong to a new allocation
  // whose OnAlloc has not arrived yet.
  if (it == s.live.end() || it->second.freeing) return nullptr;
  return it->second.context;
}

std::vector<cca::TraceEntry> TorchHistory::Trace(c10::DeviceIndex device) const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (device < 0 || static_cast<std::size_t>(device) >= s.traces.size()) return {};
  std::vector<TraceEntry> entries = s.traces[static_cast<std::size_t>(device)].Items();
  if (entries.empty()) return entries;
  const auto to_ns = s.clock.makeConverter();
  for (TraceEntry& e : entries) e.time_.t_ = to_ns(e.time_.approx_t_) / 1000;
  return entries;
}

std::vector<c10::CachingDeviceAllocator::AnnotationEntry> TorchHistory::Annotations() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<AnnotationEntry> entries = s.annotations.Items();
  if (entries.empty()) return entries;
  const auto to_ns = s.clock.makeConverter();
  for (AnnotationEntry& e : entries) e.time_.t_ = to_ns(e.time_.approx_t_) / 1000;
  return entries;
}

TorchHistory::Window TorchHistory::TraceWindow() const {
  const State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  Window window;
  window.recording = s.enabled.load(std::memory_order_relaxed);
  window.since_us = s.clock.makeConverter()(s.since) / 1000;
  window.max_entries = s.max_entries;
  window.skipped = s.skipped;
  return window;
}

}  // namespace graphalloc_torch
