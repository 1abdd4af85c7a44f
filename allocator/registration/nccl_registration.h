// Registers every mapping of an allocator with one NCCL communicator (ncclCommRegister), and deregisters it
// before it is unmapped, so that NCCL's zero-copy and NVLS paths find graphalloc's memory registered once
// instead of registering buffers per collective.
//
// Attach it with CachingAllocator::AddMappingObserver(observer, /*replay_existing=*/true); a communication
// pool (PoolOptions::communication) keeps what it registers mapped until the pool goes. NCCL errors do not
// stop the allocator (an observer cannot fail a map): the first is kept (status()) and each is counted.
// Remove the observer and call DeregisterAll() before ncclCommDestroy.
#ifndef GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_REGISTRATION_H_
#define GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_REGISTRATION_H_

#include <cstddef>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/mapping_observer.h"
#include "graphalloc/allocator/registration/nccl_library.h"
#include "graphalloc/allocator/registration/observer_errors.h"

namespace graphalloc {

class NcclRegistration : public MappingObserver {
 public:
  // An observer for the communicator `comm` (an ncclComm_t), NCCL loaded as NcclLibrary::Load() says.
  static absl::StatusOr<std::shared_ptr<NcclRegistration>> Create(void* comm);
  // The same for the mappings of one pool only (a communication pool, PoolOptions::communication): the
  // others are left unregistered, so that NCCL holds registrations only for the buffers it is given.
  static absl::StatusOr<std::shared_ptr<NcclRegistration>> CreateForPool(void* comm, PoolId pool);
  ~NcclRegistration() override;

  void OnMap(const MappingEvent& event) override;
  void OnUnmap(const MappingEvent& event) override;

  // Deregisters every mapping still registered; the first error, if any.
  absl::Status DeregisterAll();
  // The first NCCL error of a map or unmap (OK if none), and how many there were.
  absl::Status status() const { return errors_.first(); }
  std::size_t errors() const { return errors_.count(); }
  // Mappings registered now.
  std::size_t registered() const;

 private:
  static absl::StatusOr<std::shared_ptr<NcclRegistration>> Make(void* comm, std::optional<PoolId> pool);
  NcclRegistration(const NcclLibrary& nccl, void* comm, std::optional<PoolId> pool)
      : nccl_(nccl), comm_(comm), pool_(pool) {}
  bool Mine(const MappingEvent& event) const { return !pool_.has_value() || event.pool == *pool_; }

  const NcclLibrary& nccl_;
  void* const comm_;
  const std::optional<PoolId> pool_;  // only this pool's mappings; all when empty
  mutable Mutex mu_;
  absl::btree_map<DevicePtr, void*> handles_ ABSL_GUARDED_BY(mu_);  // by mapping address
  ObserverErrors errors_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_REGISTRATION_NCCL_REGISTRATION_H_
