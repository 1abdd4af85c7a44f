// The allocator's configuration: one typed value, parsed from GRAPHALLOC_CONF or built in code.
//
// The syntax is PYTORCH_CUDA_ALLOC_CONF's for the keys the two share:
//   "expandable_segments:True,max_split_size_mb:256,roundup_power2_divisions:[64:8,256:4,>:1]"
// Unknown keys and bad values are errors naming the key and what it accepts. Keys that only PyTorch's
// allocator has (backend, pinned_*, graph_capture_record_stream_reuse) are accepted with a warning, so a
// PYTORCH_CUDA_ALLOC_CONF copied as it is still works.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_CONFIG_H_
#define GRAPHALLOC_ALLOCATOR_CORE_CONFIG_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/base/bytes.h"

namespace graphalloc {

// Power-of-two intervals for roundup_power2_divisions: [1 MiB, 2 MiB), ... up to >= 32 GiB.
inline constexpr int kRoundUpPowerOfTwoIntervals = 16;

struct Config {
  // Requests at least this large are "oversize": never split, and smaller requests never take them.
  std::size_t max_split_size = std::numeric_limits<std::size_t>::max();
  // An oversize request may take a cached block at most this much larger than itself.
  std::size_t max_non_split_rounding_size = 20 * kMiB;
  // Segment size for large requests below 10 MiB (PyTorch's kLargeBuffer).
  std::size_t large_segment_size = 20 * kMiB;
  // Per power-of-two interval: round sizes up to one of this many steps (0 or 1: no rounding).
  std::array<std::size_t, kRoundUpPowerOfTwoIntervals> roundup_power2_divisions{};
  // Fraction of the memory fraction's limit above which cached blocks are reclaimed (0: off).
  double garbage_collection_threshold = 0.0;
  // Grow segments by mapping physical pages into reserved address ranges (CUDA VMM); False: one
  // cuMemAlloc per segment, as PyTorch's default.
  bool expandable_segments = true;
  // Expandable segments place blocks so that none spans two physical handles: a block larger than a chunk
  // gets a handle of its own, and frees never merge across a handle's edge. For memory registered with
  // NCCL or RDMA, which resolve a pointer to the one handle under it (docs/sharing.md).
  bool handle_aligned = false;
  // Cap on this allocator's reserved memory as a fraction of the device's total (1.0: no cap).
  double per_process_memory_fraction = 1.0;
  // Allocation history (snapshots' "history"): on from the start, how many events kept, with C++ stacks.
  bool record_history = false;
  std::size_t history_max_entries = 100000;
  bool history_stacks = false;
  // Every expandable segment's physical memory is created exportable (a POSIX file descriptor handle), so
  // that its blocks can be shared with other processes (allocator/ipc/, docs/sharing.md). Off by
  // default: PoolOptions::shareable asks it for one pool only.
  bool shareable_handles = false;

  // Parses a configuration string; an empty string gives the defaults. PyTorch-only keys are checked and
  // then ignored, with one line on stderr per key the first time this process sees it.
  static absl::StatusOr<Config> Parse(absl::string_view text);
  // The same without the warning: the PyTorch-only keys that were ignored are appended to `ignored`.
  static absl::StatusOr<Config> Parse(absl::string_view text, std::vector<std::string>* ignored);
  // Parses the GRAPHALLOC_CONF environment variable (defaults when unset).
  static absl::StatusOr<Config> FromEnvironment();
  // The configuration in the syntax Parse() reads (round-trips).
  std::string ToString() const;
  // Only the entries that differ from Config{} in ToString()'s syntax; "" for the defaults.
  std::string DiffFromDefaults() const;

  friend bool operator==(const Config&, const Config&) = default;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_CONFIG_H_
