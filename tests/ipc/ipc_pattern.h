// The byte patterns the ipc tests' two processes write and check (block_sharing_test.cc, ipc_peer.cc).
#ifndef GRAPHALLOC_TESTS_IPC_IPC_PATTERN_H_
#define GRAPHALLOC_TESTS_IPC_IPC_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace graphalloc::testing {

// Byte i is seed + 31 i + (i >> 12): differs between seeds and between the pages of a chunk.
inline std::vector<std::uint8_t> IpcPattern(std::size_t n, int seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed + i * 31 + (i >> 12));
  return v;
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_IPC_IPC_PATTERN_H_
