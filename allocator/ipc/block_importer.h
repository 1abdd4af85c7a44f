// Maps a block another process exported (BlockExporter) into this process: ImportBlock() connects to the
// exporter, receives the block's memory as file descriptors and maps it; the ImportedBlock it returns
// unmaps it and closes the connection (which releases the exporter's hold) when closed or destroyed.
#ifndef GRAPHALLOC_ALLOCATOR_IPC_BLOCK_IMPORTER_H_
#define GRAPHALLOC_ALLOCATOR_IPC_BLOCK_IMPORTER_H_

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/ipc/export_token.h"
#include "graphalloc/allocator/ipc/fd_channel.h"

namespace graphalloc::ipc {

// An imported block, mapped for `driver`'s device. Move-only.
class ImportedBlock {
 public:
  ImportedBlock() = default;
  ImportedBlock(ImportedBlock&& other) noexcept;
  ImportedBlock& operator=(ImportedBlock&& other) noexcept;
  ImportedBlock(const ImportedBlock&) = delete;
  ImportedBlock& operator=(const ImportedBlock&) = delete;
  ~ImportedBlock() { (void)Close(); }

  // The block's first byte in this process, and its size.
  DevicePtr ptr() const { return ptr_; }
  std::size_t size() const { return size_; }
  const ExportToken& token() const { return token_; }
  bool is_open() const { return driver_ != nullptr; }

  // Unmaps and releases what was imported, frees the reservation and closes the connection, waiting (up to
  // 10 s) until the exporter has released its hold; the first error is returned, and everything else is
  // still undone. Idempotent.
  absl::Status Close();

 private:
  friend absl::StatusOr<ImportedBlock> ImportBlock(Driver& driver, const ExportToken& token,
                                                   absl::Duration timeout, std::span<const int> peers);

  Driver* driver_ = nullptr;
  ExportToken token_;
  FdChannel channel_;
  DevicePtr ptr_ = 0;
  std::size_t size_ = 0;
  // Expandable: the reservation and the imported handles mapped in it (unmapped as one range).
  DevicePtr reservation_ = 0;
  std::size_t reservation_size_ = 0;
  std::size_t mapped_size_ = 0;  // [reservation_, reservation_ + mapped_size_) is mapped
  std::vector<PhysicalHandle> handles_;
  // Regular: the segment opened through its IPC handle.
  DevicePtr ipc_base_ = 0;
};

// Imports the block `token` names. The errors name the block, the exporting pid and the reason: the
// exporter is gone, the block is not exported (any more), the exporter refused, or a driver call failed.
// An expandable segment's block is accessible to `driver`'s device and to `peers` (devices that will read
// or copy it directly, e.g. a copy to another GPU); a regular segment's, to the devices CUDA IPC allows.
absl::StatusOr<ImportedBlock> ImportBlock(Driver& driver, const ExportToken& token,
                                          absl::Duration timeout = absl::Seconds(30),
                                          std::span<const int> peers = {});

}  // namespace graphalloc::ipc

#endif  // GRAPHALLOC_ALLOCATOR_IPC_BLOCK_IMPORTER_H_
