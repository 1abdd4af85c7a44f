// The C ABI of NCCL registration (graphalloc.h): NcclRegistration observers of the process-wide allocators,
// by handle, for Python (graphalloc.torch.register_nccl) and other callers that hold an ncclComm_t.
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "graphalloc/allocator/c_api/c_api_internal.h"
#include "graphalloc/allocator/c_api/graphalloc.h"
#include "graphalloc/allocator/core/default_allocator.h"
#include "graphalloc/allocator/registration/nccl_registration.h"

namespace graphalloc::c_api {
namespace {

struct Registration {
  CachingAllocator* allocator = nullptr;
  std::shared_ptr<NcclRegistration> observer;
};

struct Registrations {
  absl::Mutex mu;
  std::uint64_t next ABSL_GUARDED_BY(mu) = 1;
  absl::flat_hash_map<std::uint64_t, Registration> by_handle ABSL_GUARDED_BY(mu);
};

Registrations& TheRegistrations() {
  static Registrations* registrations = new Registrations();
  return *registrations;
}

absl::StatusOr<Registration> Find(std::uint64_t handle, const char* caller) {
  Registrations& all = TheRegistrations();
  absl::MutexLock lock(&all.mu);
  auto it = all.by_handle.find(handle);
  if (it == all.by_handle.end()) {
    return absl::NotFoundError(absl::StrCat(caller, ": no NCCL registration ", handle));
  }
  return it->second;
}

}  // namespace
}  // namespace graphalloc::c_api

using graphalloc::c_api::Guarded;

extern "C" {

int graphalloc_nccl_register(int device, uint64_t pool, void* comm, uint64_t* registration) {
  return Guarded([&]() -> absl::Status {
    if (registration == nullptr) {
      return absl::InvalidArgumentError("graphalloc_nccl_register: registration (the output) is NULL");
    }
    *registration = 0;
    absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
    if (!allocator.ok()) return allocator.status();
    absl::StatusOr<std::shared_ptr<graphalloc::NcclRegistration>> observer =
        pool == GRAPHALLOC_ALL_POOLS ? graphalloc::NcclRegistration::Create(comm)
                                     : graphalloc::NcclRegistration::CreateForPool(comm, pool);
    if (!observer.ok()) return observer.status();
    if (absl::Status s = (*allocator)->AddMappingObserver(*observer, /*replay_existing=*/true); !s.ok()) {
      return s;
    }
    graphalloc::c_api::Registrations& all = graphalloc::c_api::TheRegistrations();
    absl::MutexLock lock(&all.mu);
    const std::uint64_t handle = all.next++;
    all.by_handle[handle] = {*allocator, *std::move(observer)};
    *registration = handle;
    return absl::OkStatus();
  });
}

int graphalloc_nccl_registration_stats(uint64_t registration, size_t* registered, size_t* errors) {
  return Guarded([&]() -> absl::Status {
    absl::StatusOr<graphalloc::c_api::Registration> r =
        graphalloc::c_api::Find(registration, "graphalloc_nccl_registration_stats");
    if (!r.ok()) return r.status();
    if (registered != nullptr) *registered = r->observer->registered();
    if (errors != nullptr) *errors = r->observer->errors();
    return r->observer->status();
  });
}

int graphalloc_nccl_unregister(uint64_t registration) {
  return Guarded([&]() -> absl::Status {
    graphalloc::c_api::Registration r;
    {
      graphalloc::c_api::Registrations& all = graphalloc::c_api::TheRegistrations();
      absl::MutexLock lock(&all.mu);
      auto it = all.by_handle.find(registration);
      if (it == all.by_handle.end()) {
        return absl::NotFoundError(
            absl::StrCat("graphalloc_nccl_unregister: no NCCL registration ", registration));
      }
      r = std::move(it->second);
      all.by_handle.erase(it);
    }
    absl::Status removed = r.allocator->RemoveMappingObserver(r.observer.get());
    absl::Status deregistered = r.observer->DeregisterAll();
    return removed.ok() ? deregistered : removed;
  });
}

}  // extern "C"
