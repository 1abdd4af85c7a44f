#include "graphalloc/allocator/core/expandable_segment.h"

namespace graphalloc {

absl::Status MapChunks(Driver& driver, std::span<const ChunkPlacement> chunks, std::span<const int> peers,
                       std::vector<ChunkPlacement>* no_access) {
  if (chunks.empty()) return absl::OkStatus();
  std::size_t mapped = 0;
  absl::Status status;
  for (; mapped < chunks.size(); ++mapped) {
    status = driver.MemMap(chunks[mapped].ptr, chunks[mapped].size, chunks[mapped].handle);
    if (!status.ok()) break;
  }
  if (status.ok()) {
    const DevicePtr begin = chunks.front().ptr;
    const DevicePtr end = chunks.back().ptr + chunks.back().size;
    // One call over the whole range: the driver's cost is per mapping either way.
    status = driver.MemSetAccess(begin, end - begin, peers);
    if (status.ok()) return status;
  }
  for (std::size_t i = 0; i < mapped; ++i) {
    if (!driver.MemUnmap(chunks[i].ptr, chunks[i].size).ok()) no_access->push_back(chunks[i]);
  }
  return status;
}

}  // namespace graphalloc
