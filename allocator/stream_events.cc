// Cross-stream safety: a block used on other streams (RecordStream) is reused only after events recorded
// on those streams at Free() time have completed. Events are queried lazily, at the next allocation.
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"

namespace graphalloc {

absl::Status CachingAllocator::FreeWithStreamUses(DevicePtr ptr, Block* block) {
  absl::InlinedVector<Stream, 2> streams;
  absl::InlinedVector<Event, 2> events;
  {
    absl::MutexLock lock(&mu_);
    auto it = allocated_.find(ptr);
    if (it == allocated_.end() || it->second != block || block->freeing)
      return UnknownPointerError("Free", ptr);
    // Marked at once, so that a concurrent second Free of the same pointer is refused.
    block->freeing = true;
    streams.assign(block->stream_uses.begin(), block->stream_uses.end());
    while (events.size() < streams.size() && !idle_events_.empty()) {
      events.push_back(idle_events_.back());
      idle_events_.pop_back();
    }
  }
  absl::Status status;
  while (status.ok() && events.size() < streams.size()) {
    absl::StatusOr<Event> e = driver_->EventCreate();
    if (e.ok()) {
      events.push_back(*e);
    } else {
      status = e.status();
    }
  }
  for (std::size_t i = 0; status.ok() && i < streams.size(); ++i)
    status = driver_->EventRecord(events[i], streams[i]);

  absl::MutexLock lock(&mu_);
  idle_events_.insert(idle_events_.end(), events.begin() + (status.ok() ? streams.size() : 0), events.end());
  block->freeing = false;
  // On failure the block stays allocated, exactly as before the call.
  if (!status.ok()) return status;
  allocated_.erase(ptr);
  block->allocated = false;
  UpdateAllocationStats(block, block->segment->pool->is_small, -1);
  block->requested_size = 0;
  block->stream_uses.clear();
  block->event_count = static_cast<int>(streams.size());
  for (std::size_t i = 0; i < streams.size(); ++i)
    pending_events_[streams[i]].push_back({events[i], block, next_pending_event_id_++});
  pending_event_count_.fetch_add(static_cast<std::int64_t>(streams.size()), std::memory_order_relaxed);
  return absl::OkStatus();
}

void CachingAllocator::CompleteEvent(const PendingEvent& pending) {
  idle_events_.push_back(pending.event);
  pending_event_count_.fetch_sub(1, std::memory_order_relaxed);
  if (--pending.block->event_count == 0) ReleaseToPool(pending.block);
}

void CachingAllocator::ProcessEvents() {
  // Query the oldest event of each stream with the lock released; complete those done in a second pass.
  constexpr std::size_t kMaxQueries = 32;
  std::array<PendingEvent, kMaxQueries> heads;
  std::size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [stream, queue] : pending_events_) {
      if (n == kMaxQueries) break;
      if (!queue.empty()) heads[n++] = queue.front();
    }
  }
  std::array<bool, kMaxQueries> done{};
  for (std::size_t i = 0; i < n; ++i) {
    absl::StatusOr<bool> ready = driver_->EventQuery(heads[i].event);
    // An event that cannot be queried is left for EmptyCache's synchronization.
    done[i] = ready.ok() && *ready;
  }
  absl::MutexLock lock(&mu_);
  for (std::size_t i = 0; i < n; ++i) {
    if (!done[i]) continue;
    for (auto& [stream, queue] : pending_events_) {
      if (!queue.empty() && queue.front().id == heads[i].id) {
        CompleteEvent(queue.front());
        queue.pop_front();
        // Later events on the same stream were recorded after this one: they are done too only if queried.
        break;
      }
    }
  }
}

absl::Status CachingAllocator::SynchronizeAndFreeEvents() {
  std::vector<std::pair<Stream, PendingEvent>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [stream, queue] : pending_events_) {
      for (const PendingEvent& p : queue) all.emplace_back(stream, p);
    }
    if (all.empty()) return absl::OkStatus();
  }
  absl::Status status;
  std::size_t synced = 0;
  for (; synced < all.size(); ++synced) {
    status = driver_->EventSynchronize(all[synced].second.event);
    if (!status.ok()) break;
  }
  absl::MutexLock lock(&mu_);
  ++stats_.num_sync_all_streams;
  for (std::size_t i = 0; i < synced; ++i) {
    auto& queue = pending_events_[all[i].first];
    auto it = std::find_if(queue.begin(), queue.end(),
                           [&](const PendingEvent& p) { return p.id == all[i].second.id; });
    if (it == queue.end()) continue;  // completed meanwhile by another thread
    CompleteEvent(*it);
    queue.erase(it);
  }
  return status;
}

}  // namespace graphalloc
