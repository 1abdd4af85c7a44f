// Exports every mapping of an allocator as a dma-buf file descriptor (Driver::MemGetDmaBufFd) and hands it
// to the caller, who registers it with another device's driver: an RDMA NIC's ibv_reg_dmabuf_mr, so that
// the NIC reads and writes graphalloc's memory directly. The descriptor is closed when the mapping goes.
//
// Attach it with CachingAllocator::AddMappingObserver(observer, /*replay_existing=*/true). Errors do not stop
// the allocator (an observer cannot fail a map): the first is kept (status()) and each is counted.
#ifndef GRAPHALLOC_ALLOCATOR_REGISTRATION_DMA_BUF_EXPORT_H_
#define GRAPHALLOC_ALLOCATOR_REGISTRATION_DMA_BUF_EXPORT_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/core/mapping_observer.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/registration/observer_errors.h"

namespace graphalloc {

class DmaBufExport : public MappingObserver {
 public:
  // `on_export` gets each mapping's descriptor once it is mapped (the NIC registers it then); `on_release`
  // (may be empty) gets it before it is unmapped (the NIC deregisters it), after which it is closed. Both
  // are called as observers are (mapping_observer.h): they must not throw nor call the allocator's API
  // that maps or unmaps. `driver` is the allocator's and must outlive this observer.
  using Callback = std::function<void(const MappingEvent& event, int fd)>;
  DmaBufExport(Driver& driver, Callback on_export, Callback on_release = {})
      : driver_(driver), on_export_(std::move(on_export)), on_release_(std::move(on_release)) {}
  // Closes every descriptor still open.
  ~DmaBufExport() override;

  void OnMap(const MappingEvent& event) override;
  void OnUnmap(const MappingEvent& event) override;

  // The first export error (OK if none), and how many there were.
  absl::Status status() const { return errors_.first(); }
  std::size_t errors() const { return errors_.count(); }
  // Descriptors open now, one per mapping.
  std::size_t exported() const;

 private:
  Driver& driver_;
  const Callback on_export_;
  const Callback on_release_;
  mutable Mutex mu_;
  absl::btree_map<DevicePtr, int> fds_ ABSL_GUARDED_BY(mu_);  // by mapping address
  ObserverErrors errors_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_REGISTRATION_DMA_BUF_EXPORT_H_
