#include "graphalloc/allocator/core/size_policy.h"

#include <bit>

namespace graphalloc {
namespace {

std::size_t DivisionsFor(std::size_t size, const Config& config) {
  int interval = static_cast<int>(std::bit_width(size)) - 1 - 20;  // floor(log2(size)) - 20
  if (interval < 0) interval = 0;
  if (interval >= kRoundUpPowerOfTwoIntervals) interval = kRoundUpPowerOfTwoIntervals - 1;
  return config.roundup_power2_divisions[interval];
}

// Rounds up to the next of `divisions` equal steps between the powers of two around `size`.
std::size_t RoundUpPowerOfTwoDivision(std::size_t size, std::size_t divisions) {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor_pow2 = std::bit_floor(size);
  const std::size_t step = floor_pow2 / divisions;
  if (step == 0) return floor_pow2 << 1;
  return RoundUp(size, step);
}

}  // namespace

std::size_t RoundSize(std::size_t bytes, const Config& config) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  const std::size_t divisions = DivisionsFor(bytes, config);
  if (divisions > 1 && bytes > kMinBlockSize * divisions) {
    return RoundUp(RoundUpPowerOfTwoDivision(bytes, divisions), kMinBlockSize);
  }
  return RoundUp(bytes, kMinBlockSize);
}

std::size_t SegmentSizeFor(std::size_t rounded, const Config& config) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return config.large_segment_size;
  return RoundUp(rounded, kRoundLarge);
}

}  // namespace graphalloc
