// NCCL registration of an allocator's mappings (nccl_registration.h).
#include "graphalloc/allocator/registration/nccl_registration.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace graphalloc {

absl::StatusOr<std::shared_ptr<NcclRegistration>> NcclRegistration::Make(void* comm,
                                                                         std::optional<PoolId> pool) {
  if (comm == nullptr) return absl::InvalidArgumentError("NcclRegistration: the communicator is null");
  absl::StatusOr<const NcclLibrary*> nccl = NcclLibrary::Load();
  if (!nccl.ok()) return nccl.status();
  return std::shared_ptr<NcclRegistration>(new NcclRegistration(**nccl, comm, pool));
}

absl::StatusOr<std::shared_ptr<NcclRegistration>> NcclRegistration::Create(void* comm) {
  return Make(comm, std::nullopt);
}

absl::StatusOr<std::shared_ptr<NcclRegistration>> NcclRegistration::CreateForPool(void* comm, PoolId pool) {
  return Make(comm, pool);
}

NcclRegistration::~NcclRegistration() { (void)DeregisterAll(); }

void NcclRegistration::OnMap(const MappingEvent& event) {
  if (!Mine(event)) return;
  void* handle = nullptr;
  const int result = nccl_.comm_register(comm_, reinterpret_cast<void*>(event.ptr), event.size, &handle);
  if (result != 0) {
    errors_.Add(
        nccl_.Error(absl::StrFormat("ncclCommRegister of the mapping at 0x%x (%d bytes, pool %d, device %d)",
                                    event.ptr, event.size, event.pool, event.device),
                    result));
    return;
  }
  MutexLock lock(&mu_);
  handles_[event.ptr] = handle;
}

void NcclRegistration::OnUnmap(const MappingEvent& event) {
  if (!Mine(event)) return;
  void* handle = nullptr;
  {
    MutexLock lock(&mu_);
    auto it = handles_.find(event.ptr);
    if (it == handles_.end()) return;  // its registration failed: nothing to undo
    handle = it->second;
    handles_.erase(it);
  }
  const int result = nccl_.comm_deregister(comm_, handle);
  if (result != 0) {
    errors_.Add(nccl_.Error(
        absl::StrFormat("ncclCommDeregister of the mapping at 0x%x (%d bytes, pool %d, device %d)", event.ptr,
                        event.size, event.pool, event.device),
        result));
  }
}

absl::Status NcclRegistration::DeregisterAll() {
  absl::btree_map<DevicePtr, void*> handles;
  {
    MutexLock lock(&mu_);
    handles.swap(handles_);
  }
  absl::Status first;
  for (const auto& [ptr, handle] : handles) {
    const int result = nccl_.comm_deregister(comm_, handle);
    if (result != 0 && first.ok())
      first = nccl_.Error(absl::StrFormat("ncclCommDeregister of the mapping at 0x%x", ptr), result);
  }
  return first;
}

std::size_t NcclRegistration::registered() const {
  MutexLock lock(&mu_);
  return handles_.size();
}

}  // namespace graphalloc
