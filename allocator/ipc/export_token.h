// The printable handle of an exported block: what an importing process needs to find the exporter and ask
// for the block (socket name, exporter pid, block id) and to check what it got (address, size, kind).
// At most 255 bytes, so that it travels where PyTorch puts its own sharing handle.
#ifndef GRAPHALLOC_ALLOCATOR_IPC_EXPORT_TOKEN_H_
#define GRAPHALLOC_ALLOCATOR_IPC_EXPORT_TOKEN_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc::ipc {

// How the block's memory reaches the importer.
enum class SegmentKind {
  kExpandable,  // the physical handles of the chunks under it, as file descriptors
  kRegular,     // a cuIpcGetMemHandle of its segment, and its offset there
};

struct ExportToken {
  static constexpr std::size_t kMaxLength = 255;

  std::string socket;  // the exporter's listener, abstract namespace, without the leading NUL
  pid_t pid = 0;       // the exporting process
  std::uint64_t block_id = 0;
  DevicePtr ptr = 0;  // the block's address in the exporter (for messages and checks)
  std::size_t size = 0;
  SegmentKind kind = SegmentKind::kExpandable;

  // "graphalloc-ipc:1:<socket>:<pid>:<block id>:<ptr hex>:<size>:<e|r>"
  std::string ToString() const;
  // InvalidArgument naming what is wrong for anything ToString() did not write.
  static absl::StatusOr<ExportToken> Parse(absl::string_view text);
  // "block 0x7f.. (4194304 bytes) of pid 1234" for messages.
  std::string Describe() const;

  friend bool operator==(const ExportToken&, const ExportToken&) = default;
};

}  // namespace graphalloc::ipc

#endif  // GRAPHALLOC_ALLOCATOR_IPC_EXPORT_TOKEN_H_
