// Shares blocks of a CachingAllocator with other processes: Export() makes a token, and a server thread
// answers each importer that connects with the block's memory as file descriptors (ipc_protocol.h).
//
// Lifetime: Export() holds the block (CachingAllocator::HoldBlock) until Revoke(); each importing
// connection holds it too, until the importer closes it or dies (the socket's end). The owner may Free()
// the block at any time: its memory is neither reused nor unmapped before the last hold goes. Expandable
// segments share their chunks' physical handles, which must be created exportable (Config::
// shareable_handles or PoolOptions::shareable); regular segments share a cuIpcGetMemHandle of the segment.
// docs/sharing.md says more.
#ifndef GRAPHALLOC_ALLOCATOR_IPC_BLOCK_EXPORTER_H_
#define GRAPHALLOC_ALLOCATOR_IPC_BLOCK_EXPORTER_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/ipc/export_token.h"
#include "graphalloc/allocator/ipc/fd_channel.h"

namespace graphalloc::ipc {

class BlockExporter {
 public:
  // Listens on a fresh abstract socket ("graphalloc-ipc-<pid>-<n>") with one server thread.
  static absl::StatusOr<std::unique_ptr<BlockExporter>> Create(CachingAllocator& allocator);
  // Stops serving and releases every hold, its own and its importers' (their mappings stay valid on the
  // device, but the allocator may reuse the memory: destroy the exporter after the importers closed).
  ~BlockExporter();
  BlockExporter(const BlockExporter&) = delete;
  BlockExporter& operator=(const BlockExporter&) = delete;

  // A token for the block that Allocate() returned at `ptr`; the block is held until Revoke(ptr).
  // Exporting a block again gives the same token. FailedPrecondition for a block of an expandable segment
  // whose handles do not export (it says what to set); the allocator's errors for an unknown pointer.
  absl::StatusOr<ExportToken> Export(DevicePtr ptr);
  // Ends the export of the block at `ptr`: no new importer gets it; those connected keep their holds.
  absl::Status Revoke(DevicePtr ptr);

  const std::string& socket_name() const { return socket_name_; }
  // Importers connected now (each holds its block).
  std::size_t connections() const;
  // Waits until exactly `n` importers are connected; DeadlineExceeded after `timeout`.
  absl::Status WaitForConnections(std::size_t n, absl::Duration timeout) const;

 private:
  struct Exported {
    std::uint64_t id = 0;
    HeldBlock block;
  };
  struct Connection {
    FdChannel channel;
    DevicePtr ptr = 0;  // the block it holds
  };

  BlockExporter(CachingAllocator& allocator, FdListener listener, int wake_fd);
  void Serve();
  // Answers a new connection; true when it now holds a block (kept open), false when it was refused.
  bool Answer(Connection& connection);
  absl::Status SendBlock(Connection& connection, const Exported& exported);

  CachingAllocator& allocator_;
  FdListener listener_;
  const std::string socket_name_;
  const int wake_fd_;  // an eventfd the destructor writes to stop the server thread
  std::thread server_;

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::map<DevicePtr, Exported> exports_;  // by block address
  std::uint64_t next_id_ = 1;
  std::size_t connections_ = 0;  // the server thread's, mirrored for connections()
};

}  // namespace graphalloc::ipc

#endif  // GRAPHALLOC_ALLOCATOR_IPC_BLOCK_EXPORTER_H_
