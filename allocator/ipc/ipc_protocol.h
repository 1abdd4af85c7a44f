// The messages between BlockExporter and ImportBlock, and their order, on one FdChannel per import:
//   importer -> exporter  ImportRequest (the token's block id)
//   exporter -> importer  ImportReply (the outcome; the block's figures; for a regular segment its IPC
//                         handle, with the simulated device's memfd attached)
//   exporter -> importer  for an expandable segment, ChunkBatch frames of up to kMaxFdsPerFrame chunks,
//                         each chunk's file descriptor attached in order
// then nothing: the connection stays open while the importer maps the block. Its end (the importer shuts
// its side down, or dies) releases the exporter's hold on the block; the exporter then closes its side,
// which a closing importer waits for, so that the release is done when its Close() returns. Plain structs
// copied byte for byte: both ends are this library on one host.
#ifndef GRAPHALLOC_ALLOCATOR_IPC_IPC_PROTOCOL_H_
#define GRAPHALLOC_ALLOCATOR_IPC_IPC_PROTOCOL_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace graphalloc::ipc {

inline constexpr std::uint32_t kProtocolVersion = 1;

struct ImportRequest {
  std::array<char, 8> magic{'g', 'a', 'i', 'p', 'c', 'r', 'e', 'q'};
  std::uint32_t version = kProtocolVersion;
  std::uint32_t reserved = 0;
  std::uint64_t block_id = 0;
};

struct ImportReply {
  std::array<char, 8> magic{'g', 'a', 'i', 'p', 'c', 'r', 'e', 'p'};
  std::uint32_t version = kProtocolVersion;
  std::int32_t code = 0;  // absl::StatusCode; 0: OK
  std::uint64_t block_ptr = 0;
  std::uint64_t block_size = 0;
  std::uint32_t expandable = 0;       // 1: chunks follow; 0: a regular segment
  std::uint32_t chunk_count = 0;      // expandable
  std::uint64_t block_offset = 0;     // regular: the block's offset in its segment
  std::array<char, 64> ipc_handle{};  // regular: cuIpcGetMemHandle's bytes
  std::array<char, 512> message{};    // why, when code != 0 (NUL-terminated)
};

struct ChunkEntry {
  std::int64_t offset = 0;  // the chunk's address minus the block's (the first may be negative)
  std::uint64_t size = 0;
  std::uint64_t fd_offset = 0;  // ShareableHandle::offset
};

template <typename T>
std::string Encode(const T& value) {
  static_assert(std::is_trivially_copyable_v<T>);
  return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
bool Decode(absl::string_view bytes, T* value) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) return false;
  std::memcpy(value, bytes.data(), sizeof(T));
  return true;
}

}  // namespace graphalloc::ipc

#endif  // GRAPHALLOC_ALLOCATOR_IPC_IPC_PROTOCOL_H_
