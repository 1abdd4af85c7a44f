// Mapping observers and pins: the list of observers, the calls to them, and the pinned ranges
// (mapping_hooks.h).
#include "graphalloc/allocator/core/mapping_hooks.h"

#include <algorithm>
#include <cstdio>
#include <exception>

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/pool_state.h"
#include "graphalloc/allocator/core/stream_shard.h"

namespace graphalloc {

PoolId PoolOf(const Segment& segment) {
  return segment.shard->pool != nullptr ? segment.shard->pool->id : kDefaultPool;
}

absl::Status MappingHooks::Add(std::shared_ptr<MappingObserver> observer) {
  if (observer == nullptr) return absl::InvalidArgumentError("AddMappingObserver: the observer is null");
  MutexLock lock(&mu_);
  if (std::find(observers_.begin(), observers_.end(), observer) != observers_.end()) {
    return absl::AlreadyExistsError("AddMappingObserver: this observer is registered already");
  }
  observers_.push_back(std::move(observer));
  observer_count_.store(observers_.size(), std::memory_order_release);
  return absl::OkStatus();
}

absl::Status MappingHooks::Remove(const MappingObserver* observer) {
  MutexLock lock(&mu_);
  auto it = std::find_if(observers_.begin(), observers_.end(),
                         [&](const std::shared_ptr<MappingObserver>& o) { return o.get() == observer; });
  if (it == observers_.end()) {
    return absl::NotFoundError("RemoveMappingObserver: the observer is not registered with this allocator");
  }
  observers_.erase(it);
  observer_count_.store(observers_.size(), std::memory_order_release);
  return absl::OkStatus();
}

void MappingHooks::Map(PoolId pool, DevicePtr ptr, std::size_t size, PhysicalHandle handle, bool expandable) {
  if (observer_count_.load(std::memory_order_acquire) == 0) return;
  Notify(true, Event(pool, ptr, size, handle, expandable));
}

void MappingHooks::Unmap(PoolId pool, DevicePtr ptr, std::size_t size, PhysicalHandle handle,
                         bool expandable) {
  if (observer_count_.load(std::memory_order_acquire) == 0) return;
  Notify(false, Event(pool, ptr, size, handle, expandable));
}

void MappingHooks::Notify(bool map, const MappingEvent& event) {
  std::vector<std::shared_ptr<MappingObserver>> observers;
  {
    MutexLock lock(&mu_);
    observers = observers_;
  }
  // An observer must not throw (mapping_observer.h); one that does leaves the mapping as it is and the
  // other observers still told.
  for (const std::shared_ptr<MappingObserver>& o : observers) {
    try {
      if (map) {
        o->OnMap(event);
      } else {
        o->OnUnmap(event);
      }
    } catch (const std::exception& e) {
      Report(map ? "OnMap" : "OnUnmap", event, e.what());
    } catch (...) {
      Report(map ? "OnMap" : "OnUnmap", event, "an exception that is not a std::exception");
    }
  }
}

void MappingHooks::Replay(MappingObserver& observer, const std::vector<MappingEvent>& events) {
  for (const MappingEvent& e : events) {
    try {
      observer.OnMap(e);
    } catch (const std::exception& ex) {
      Report("OnMap", e, ex.what());
    } catch (...) {
      Report("OnMap", e, "an exception that is not a std::exception");
    }
  }
}

void MappingHooks::Report(const char* what, const MappingEvent& event, const std::string& message) {
  const std::string text = absl::StrFormat(
      "graphalloc: a mapping observer's %s threw for the mapping at 0x%x (%d bytes, pool %d, "
      "device %d): %s; observers must not throw",
      what, event.ptr, event.size, event.pool, event.device, message);
  std::fprintf(stderr, "%s\n", text.c_str());
  MutexLock lock(&mu_);
  ++errors_.count;
  errors_.last = text;
}

MappingObserverErrors MappingHooks::errors() const {
  MutexLock lock(&mu_);
  return errors_;
}

void MappingHooks::Pin(DevicePtr ptr, std::size_t size) {
  MutexLock lock(&mu_);
  ++pins_[{ptr, size}];
  largest_pin_ = std::max(largest_pin_, size);
  pin_count_.store(pins_.size(), std::memory_order_release);
}

absl::Status MappingHooks::Unpin(DevicePtr ptr, std::size_t size) {
  MutexLock lock(&mu_);
  auto it = pins_.find({ptr, size});
  if (it == pins_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "UnpinMapping(0x%x, %d): this range is not pinned; unpin exactly the ranges PinMapping pinned", ptr,
        size));
  }
  if (--it->second == 0) pins_.erase(it);
  pin_count_.store(pins_.size(), std::memory_order_release);
  return absl::OkStatus();
}

bool MappingHooks::Pinned(DevicePtr begin, DevicePtr end) const {
  if (pin_count_.load(std::memory_order_acquire) == 0) return false;
  MutexLock lock(&mu_);
  // A pin overlapping [begin, end) starts before `end` and at most largest_pin_ bytes before `begin`.
  const DevicePtr from = begin > largest_pin_ ? begin - largest_pin_ : 0;
  for (auto it = pins_.lower_bound({from, 0}); it != pins_.end() && it->first.first < end; ++it) {
    if (it->first.first + it->first.second > begin) return true;
  }
  return false;
}

absl::Status MappingHooks::CheckInvariants() const {
  MutexLock lock(&mu_);
  if (pin_count_.load(std::memory_order_relaxed) != pins_.size()) {
    return absl::InternalError(absl::StrFormat("mapping pins: %d pinned ranges counted, %d held",
                                               pin_count_.load(std::memory_order_relaxed), pins_.size()));
  }
  for (const auto& [range, count] : pins_) {
    if (count <= 0 || range.second == 0 || range.second > largest_pin_) {
      return absl::InternalError(
          absl::StrFormat("mapping pin of [0x%x, +%d) has count %d", range.first, range.second, count));
    }
  }
  return absl::OkStatus();
}

}  // namespace graphalloc
