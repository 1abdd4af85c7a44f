// The C ABI of private pools: ids and handles for C callers over the C++ RAII types (PrivatePool, PoolRoute,
// GraphPin), which this file keeps in a process-wide registry until the caller gives them back.
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"

namespace graphalloc::c_api {
namespace {

// Handles held for C callers. Never destroyed (as the default allocators are not): a route or pin left
// open at exit must not run its destructor after the allocator it points to is gone.
class Registry {
 public:
  // One reference taken for a C caller to (device, pool).
  void AddReference(int device, PrivatePool handle) {
    absl::MutexLock lock(&mu_);
    references_[{device, handle.id()}].push_back(std::move(handle));
  }
  // One reference given back; an empty handle when the C ABI holds none of that pool.
  PrivatePool TakeReference(int device, PoolId pool) {
    absl::MutexLock lock(&mu_);
    auto it = references_.find({device, pool});
    if (it == references_.end()) return PrivatePool();
    PrivatePool handle = std::move(it->second.back());
    it->second.pop_back();
    if (it->second.empty()) references_.erase(it);
    return handle;
  }
  std::uint64_t AddRoute(PoolRoute route) { return Add(routes_, std::move(route)); }
  // The route, taken out of the registry (inactive when `id` names none).
  PoolRoute TakeRoute(std::uint64_t id) { return Take(routes_, id); }
  std::uint64_t AddPin(GraphPin pin) { return Add(pins_, std::move(pin)); }
  GraphPin TakePin(std::uint64_t id) { return Take(pins_, id); }

 private:
  template <typename Handle>
  std::uint64_t Add(absl::flat_hash_map<std::uint64_t, Handle>& handles, Handle handle) {
    absl::MutexLock lock(&mu_);
    const std::uint64_t id = next_handle_++;
    handles.emplace(id, std::move(handle));
    return id;
  }
  // An empty handle when `id` names none.
  template <typename Handle>
  Handle Take(absl::flat_hash_map<std::uint64_t, Handle>& handles, std::uint64_t id) {
    absl::MutexLock lock(&mu_);
    auto it = handles.find(id);
    if (it == handles.end()) return Handle();
    Handle handle = std::move(it->second);
    handles.erase(it);
    return handle;
  }

  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<int, PoolId>, std::vector<PrivatePool>> references_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uint64_t, PoolRoute> routes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uint64_t, GraphPin> pins_ ABSL_GUARDED_BY(mu_);
  std::uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();
  return *registry;
}

// A temporary user of `pool` on `device`, for the C++ calls that take a PrivatePool handle.
absl::StatusOr<PrivatePool> Acquire(int device, std::uint64_t pool) {
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
  if (!allocator.ok()) return allocator.status();
  if (pool == kDefaultPool) {
    return absl::InvalidArgumentError("pool 0 is the default pool, not a private pool: create one first");
  }
  return (*allocator)->AcquirePool(pool);
}

int BeginRoute(const char* function, int device, std::uint64_t pool, PoolRouteFilter filter,
               std::uint64_t* route) {
  return Guarded([&]() -> absl::Status {
    if (route == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(function, ": route (the output) is NULL"));
    *route = 0;
    absl::StatusOr<PrivatePool> handle = Acquire(device, pool);
    if (!handle.ok()) return handle.status();
    absl::StatusOr<PoolRoute> opened = handle->allocator()->BeginAllocateToPool(*handle, std::move(filter));
    if (!opened.ok()) return opened.status();
    *route = TheRegistry().AddRoute(*std::move(opened));
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status CreatePool(const char* function, int device, const graphalloc_pool_options* options,
                        const char* tag, uint64_t* pool, bool communication) {
  if (pool == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(function, ": pool (the output) is NULL"));
  *pool = 0;
  absl::StatusOr<CachingAllocator*> allocator = DefaultAllocator(device);
  if (!allocator.ok()) return allocator.status();
  PoolOptions opts;
  if (options != nullptr) {
    opts.use_on_oom = options->use_on_oom != 0;
    opts.no_split = options->no_split != 0;
    opts.handle_aligned = options->handle_aligned != 0;
  }
  if (tag != nullptr) opts.tag = tag;
  opts.communication = communication;
  absl::StatusOr<PrivatePool> handle = (*allocator)->CreatePool(opts);
  if (!handle.ok()) return handle.status();
  *pool = handle->id();
  TheRegistry().AddReference(device, *std::move(handle));
  return absl::OkStatus();
}

}  // namespace graphalloc::c_api

using graphalloc::c_api::Guarded;
using graphalloc::c_api::TheRegistry;

extern "C" {

int graphalloc_pool_create(int device, const graphalloc_pool_options* options, uint64_t* pool) {
  return Guarded([&] {
    return graphalloc::c_api::CreatePool("graphalloc_pool_create", device, options, nullptr, pool);
  });
}

int graphalloc_pool_retain(int device, uint64_t pool) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::PrivatePool> handle = graphalloc::c_api::Acquire(device, pool);
    if (!handle.ok()) return handle.status();
    TheRegistry().AddReference(device, *std::move(handle));
    return absl::OkStatus();
  });
}

int graphalloc_pool_release(int device, uint64_t pool) {
  return Guarded([&]() -> absl::Status {
    graphalloc::PrivatePool handle = TheRegistry().TakeReference(device, pool);
    if (!handle) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graphalloc_pool_release: no reference to pool %d of device %d is held through the C ABI (only "
          "graphalloc_pool_create and graphalloc_pool_retain take them)",
          pool, device));
    }
    handle.Reset();  // outside the registry's lock: the pool's memory may go back to the device now
    return absl::OkStatus();
  });
}

int graphalloc_begin_allocate_to_pool_for_stream(int device, uint64_t pool, graphalloc_stream stream,
                                                 uint64_t* route) {
  return graphalloc::c_api::BeginRoute(
      "graphalloc_begin_allocate_to_pool_for_stream", device, pool,
      graphalloc::PoolRouteFilter::ForStream(graphalloc::StreamFromNative(stream)), route);
}

int graphalloc_begin_allocate_to_pool_for_capture(int device, uint64_t pool,
                                                  graphalloc_stream capturing_stream, uint64_t* route) {
  return graphalloc::c_api::BeginRoute(
      "graphalloc_begin_allocate_to_pool_for_capture", device, pool,
      graphalloc::PoolRouteFilter::ForCaptureOf(graphalloc::StreamFromNative(capturing_stream)), route);
}

int graphalloc_begin_allocate_to_pool_for_thread(int device, uint64_t pool, uint64_t* route) {
  return graphalloc::c_api::BeginRoute("graphalloc_begin_allocate_to_pool_for_thread", device, pool,
                                       graphalloc::PoolRouteFilter::ForCallingThread(), route);
}

int graphalloc_begin_allocate_to_pool_if(int device, uint64_t pool, graphalloc_route_predicate predicate,
                                         void* context, int capture_mode, uint64_t* route) {
  if (predicate == nullptr) {
    return graphalloc::c_api::Report(
        absl::InvalidArgumentError("graphalloc_begin_allocate_to_pool_if: predicate is NULL"));
  }
  auto matches = [predicate, context](graphalloc::Stream s) {
    return predicate(context, static_cast<graphalloc_stream>(graphalloc::NativeFromStream(s))) != 0;
  };
  return graphalloc::c_api::BeginRoute("graphalloc_begin_allocate_to_pool_if", device, pool,
                                       graphalloc::PoolRouteFilter::ForPredicate(matches, capture_mode != 0),
                                       route);
}

int graphalloc_end_route(uint64_t route) {
  return Guarded([&]() -> absl::Status {
    graphalloc::PoolRoute open = TheRegistry().TakeRoute(route);
    if (!open.active()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graphalloc_end_route: route %d is not open (never returned by a graphalloc_begin_allocate_to_pool "
          "function, or already ended)",
          route));
    }
    return open.End();
  });
}

int graphalloc_pool_get_stats(int device, uint64_t pool, graphalloc_pool_stats* stats) {
  return Guarded([&]() -> absl::Status {
    if (stats == nullptr)
      return absl::InvalidArgumentError("graphalloc_pool_get_stats: stats (the output) is NULL");
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<graphalloc::PoolStats> s = (*allocator)->GetPoolStats(pool);
    if (!s.ok()) return s.status();
    *stats = graphalloc_pool_stats{
        .reserved_bytes = s->reserved_bytes,
        .peak_reserved_bytes = s->peak_reserved_bytes,
        .allocated_bytes = s->allocated_bytes,
        .peak_allocated_bytes = s->peak_allocated_bytes,
        .segments = s->segments,
        .live_blocks = s->live_blocks,
        .use_count = s->use_count,
        .graph_pins = s->graph_pins,
    };
    return absl::OkStatus();
  });
}

int graphalloc_pool_empty_cache(int device, uint64_t pool) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    return (*allocator)->EmptyPoolCache(pool);
  });
}

int graphalloc_pool_pin_for_graph(int device, uint64_t pool, uint64_t* pin) {
  return Guarded([&]() -> absl::Status {
    if (pin == nullptr)
      return absl::InvalidArgumentError("graphalloc_pool_pin_for_graph: pin (the output) is NULL");
    *pin = 0;
    absl::StatusOr<graphalloc::PrivatePool> handle = graphalloc::c_api::Acquire(device, pool);
    if (!handle.ok()) return handle.status();
    absl::StatusOr<graphalloc::GraphPin> pinned = handle->allocator()->PinForGraph(*handle);
    if (!pinned.ok()) return pinned.status();
    *pin = TheRegistry().AddPin(*std::move(pinned));
    return absl::OkStatus();
  });
}

int graphalloc_pool_unpin(uint64_t pin) {
  return Guarded([&]() -> absl::Status {
    graphalloc::GraphPin held = TheRegistry().TakePin(pin);
    if (!held.active()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graphalloc_pool_unpin: pin %d is not held (never returned by graphalloc_pool_pin_for_graph, or "
          "already unpinned)",
          pin));
    }
    held.Reset();
    return absl::OkStatus();
  });
}

}  // extern "C"
