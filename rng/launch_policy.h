// The fixed thread -> (Philox subsequence, draw) mapping shared by the device kernels and the simulated
// device, so both compute the same element -> random word assignment bit for bit.
//
// Like PyTorch's calc_execution_policy / distribution_nullary_kernel:
//   - blocks of kBlockSize = 256 threads, grid = min(ceil(n / 256), kMaxGridBlocks);
//   - thread t (global index) is Philox subsequence t: PhiloxStream(seed, t, offset);
//   - with T = grid * 256 threads, iteration j of thread t draws four words (curand4) and element
//     j * 4T + k * T + t gets word k (k = 0..3) when it is below n; the stores of a warp are contiguous;
//   - every thread runs the same number of iterations, ceil(n / 4T), so the kernel consumes
//     Increment(n) = 4 * ceil(n / 4T) words per thread: the generator reserves that much.
// Unlike PyTorch, the grid cap is a constant rather than SMs * blocks-per-SM: the numbers a kernel draws must
// not depend on which GPU (or the simulator) runs it. 1056 = 132 SMs x 8 resident blocks fills an H100.
#ifndef GRAPHALLOC_RNG_LAUNCH_POLICY_H_
#define GRAPHALLOC_RNG_LAUNCH_POLICY_H_

#include <cstdint>

#include "graphalloc/rng/philox.h"

namespace graphalloc::rng_policy {

inline constexpr std::uint32_t kBlockSize = 256;
inline constexpr std::uint32_t kMaxGridBlocks = 1056;
inline constexpr std::uint32_t kWordsPerIteration = 4;  // one curand4 per iteration

// Number of blocks for n elements (at least 1).
GA_HD constexpr std::uint32_t GridBlocks(std::uint64_t n) {
  const std::uint64_t blocks = (n + kBlockSize - 1) / kBlockSize;
  return blocks == 0 ? 1 : blocks > kMaxGridBlocks ? kMaxGridBlocks : static_cast<std::uint32_t>(blocks);
}

// Number of threads for n elements.
GA_HD constexpr std::uint64_t TotalThreads(std::uint64_t n) {
  return static_cast<std::uint64_t>(GridBlocks(n)) * kBlockSize;
}

// Iterations each thread runs for n elements.
GA_HD constexpr std::uint64_t Iterations(std::uint64_t n) {
  const std::uint64_t per_iteration = TotalThreads(n) * kWordsPerIteration;
  return n == 0 ? 0 : (n - 1) / per_iteration + 1;
}

// Philox words each thread consumes for n elements: the offset increment a launch reserves (a multiple of 4).
GA_HD constexpr std::uint64_t Increment(std::uint64_t n) { return Iterations(n) * kWordsPerIteration; }

// Where element `index` comes from.
struct ElementSource {
  std::uint64_t thread = 0;     // = the Philox subsequence
  std::uint64_t iteration = 0;  // = draws (index / 4) of that thread's curand4 calls
  std::uint32_t word = 0;       // 0..3 within the curand4 result
};

GA_HD constexpr ElementSource SourceOf(std::uint64_t index, std::uint64_t n) {
  const std::uint64_t threads = TotalThreads(n);
  const std::uint64_t in_iteration = index % (threads * kWordsPerIteration);
  return ElementSource{in_iteration % threads, index / (threads * kWordsPerIteration),
                       static_cast<std::uint32_t>(in_iteration / threads)};
}

}  // namespace graphalloc::rng_policy

#endif  // GRAPHALLOC_RNG_LAUNCH_POLICY_H_
