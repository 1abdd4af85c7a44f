// dma-buf export of an allocator's mappings (dma_buf_export.h).
#include "graphalloc/allocator/registration/dma_buf_export.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_format.h"

namespace graphalloc {

DmaBufExport::~DmaBufExport() {
  MutexLock lock(&mu_);
  for (const auto& [ptr, fd] : fds_) close(fd);
}

void DmaBufExport::OnMap(const MappingEvent& event) {
  absl::StatusOr<int> fd = driver_.MemGetDmaBufFd(event.ptr, event.size);
  if (!fd.ok()) {
    errors_.Add(absl::Status(
        fd.status().code(),
        absl::StrFormat("dma-buf export of the mapping at 0x%x (%d bytes, pool %d, device %d): %s", event.ptr,
                        event.size, event.pool, event.device, fd.status().message())));
    return;
  }
  {
    MutexLock lock(&mu_);
    fds_[event.ptr] = *fd;
  }
  if (on_export_) on_export_(event, *fd);
}

void DmaBufExport::OnUnmap(const MappingEvent& event) {
  int fd = -1;
  {
    MutexLock lock(&mu_);
    auto it = fds_.find(event.ptr);
    if (it == fds_.end()) return;  // its export failed: nothing to release
    fd = it->second;
    fds_.erase(it);
  }
  if (on_release_) on_release_(event, fd);
  close(fd);
}

std::size_t DmaBufExport::exported() const {
  MutexLock lock(&mu_);
  return fds_.size();
}

}  // namespace graphalloc
