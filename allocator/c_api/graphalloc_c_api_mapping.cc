// The C ABI of mapping observers and pins (graphalloc.h): C callback pairs as MappingObservers of the
// process-wide allocators, pins of ranges, and communication pools.
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/core/mapping_observer.h"

namespace graphalloc::c_api {
namespace {

// A C callback pair with its user data.
class CallbackObserver : public MappingObserver {
 public:
  CallbackObserver(graphalloc_mapping_callback on_map, graphalloc_mapping_callback on_unmap, void* user_data)
      : on_map_(on_map), on_unmap_(on_unmap), user_data_(user_data) {}
  void OnMap(const MappingEvent& event) override { Call(on_map_, event); }
  void OnUnmap(const MappingEvent& event) override { Call(on_unmap_, event); }

 private:
  void Call(graphalloc_mapping_callback callback, const MappingEvent& e) {
    if (callback == nullptr) return;
    const graphalloc_mapping_event event{e.device,
                                         e.pool,
                                         reinterpret_cast<void*>(e.ptr),
                                         e.size,
                                         static_cast<std::uint64_t>(e.handle),
                                         e.expandable ? 1 : 0};
    callback(user_data_, &event);
  }

  const graphalloc_mapping_callback on_map_;
  const graphalloc_mapping_callback on_unmap_;
  void* const user_data_;
};

// The observers registered through the C ABI, by handle.
struct Observers {
  absl::Mutex mu;
  std::uint64_t next ABSL_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<std::uint64_t, std::pair<int, std::shared_ptr<CallbackObserver>>> by_handle
      ABSL_GUARDED_BY(mu);
};

Observers& TheObservers() {
  static Observers* observers = new Observers();
  return *observers;
}

DevicePtr AsDevicePtr(void* ptr) { return reinterpret_cast<DevicePtr>(ptr); }

}  // namespace
}  // namespace graphalloc::c_api

using graphalloc::c_api::Guarded;

extern "C" {

int graphalloc_add_mapping_observer(int device, graphalloc_mapping_callback on_map,
                                    graphalloc_mapping_callback on_unmap, void* user_data,
                                    int replay_existing, uint64_t* observer) {
  return Guarded([&]() -> absl::Status {
    if (observer == nullptr)
      return absl::InvalidArgumentError("graphalloc_add_mapping_observer: observer (the output) is NULL");
    *observer = 0;
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    auto o = std::make_shared<graphalloc::c_api::CallbackObserver>(on_map, on_unmap, user_data);
    graphalloc::c_api::Observers& all = graphalloc::c_api::TheObservers();
    std::uint64_t handle;
    {
      absl::MutexLock lock(&all.mu);
      handle = all.next++;
      all.by_handle.emplace(handle, std::make_pair(device, o));
    }
    // Outside the registry's lock: the replay calls on_map.
    if (absl::Status s = (*allocator)->AddMappingObserver(o, replay_existing != 0); !s.ok()) {
      absl::MutexLock lock(&all.mu);
      all.by_handle.erase(handle);
      return s;
    }
    *observer = handle;
    return absl::OkStatus();
  });
}

int graphalloc_remove_mapping_observer(uint64_t observer) {
  return Guarded([&]() -> absl::Status {
    graphalloc::c_api::Observers& all = graphalloc::c_api::TheObservers();
    std::pair<int, std::shared_ptr<graphalloc::c_api::CallbackObserver>> entry;
    {
      absl::MutexLock lock(&all.mu);
      auto it = all.by_handle.find(observer);
      if (it == all.by_handle.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "graphalloc_remove_mapping_observer: %d is not a registered mapping observer", observer));
      }
      entry = std::move(it->second);
      all.by_handle.erase(it);
    }
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(entry.first);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->RemoveMappingObserver(entry.second.get());
  });
}

int graphalloc_pin_mapping(int device, void* ptr, size_t size) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->PinMapping(graphalloc::c_api::AsDevicePtr(ptr), size);
  });
}

int graphalloc_unpin_mapping(int device, void* ptr, size_t size) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->UnpinMapping(graphalloc::c_api::AsDevicePtr(ptr), size);
  });
}

int graphalloc_pool_create_for_communication(int device, const graphalloc_pool_options* options,
                                             uint64_t* pool) {
  return Guarded([&] {
    return graphalloc::c_api::CreatePool("graphalloc_pool_create_for_communication", device, options, nullptr,
                                         pool, /*communication=*/true);
  });
}

int graphalloc_pool_pinned_bytes(int device, uint64_t pool, size_t* pinned_bytes) {
  return Guarded([&]() -> absl::Status {
    if (pinned_bytes == nullptr)
      return absl::InvalidArgumentError("graphalloc_pool_pinned_bytes: pinned_bytes (the output) is NULL");
    *pinned_bytes = 0;
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<graphalloc::PoolStats> stats = (*allocator)->GetPoolStats(pool);
    if (!stats.ok()) return stats.status();
    *pinned_bytes = stats->pinned_bytes;
    return absl::OkStatus();
  });
}

}  // extern "C"
