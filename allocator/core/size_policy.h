// Size classes: how a request is rounded, which pool it uses and how big a new segment for it is, as pure
// functions. These are PyTorch's CUDA caching allocator's rules, so that the same program gets the same
// block sizes and segments under graphalloc: a request rounds up to a multiple of 512 bytes (or, with
// roundup_power2_divisions, to the next of N equal steps between powers of two); up to 1 MiB it is served
// from the small pool, whose segments are 2 MiB; a larger one below 10 MiB gets a segment of
// large_segment_size (20 MiB), and from 10 MiB on a segment of its own size rounded up to 2 MiB.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_SIZE_POLICY_H_
#define GRAPHALLOC_ALLOCATOR_CORE_SIZE_POLICY_H_

#include <cstddef>

#include "graphalloc/allocator/base/bytes.h"
#include "graphalloc/allocator/core/config.h"

namespace graphalloc {

inline constexpr std::size_t kMinBlockSize = 512;         // every block is a multiple of this
inline constexpr std::size_t kSmallSize = 1 * kMiB;       // rounded requests up to this use the small pool
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;     // small-pool segment size
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;  // below this a large request gets a whole buffer
inline constexpr std::size_t kRoundLarge = 2 * kMiB;      // larger segments are rounded to this
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 60;  // 1 EiB: anything larger is refused

// The block size a request of `bytes` gets (>= 512, a multiple of 512).
std::size_t RoundSize(std::size_t bytes, const Config& config);

// True when a block of `rounded` bytes belongs in the small pool.
inline bool IsSmall(std::size_t rounded) { return rounded <= kSmallSize; }

// The size of a new regular segment that serves a request of `rounded` bytes.
std::size_t SegmentSizeFor(std::size_t rounded, const Config& config);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_SIZE_POLICY_H_
