// PhiloxArgs: the (seed, offset) argument of one random kernel launch, eager or captured into a graph.
//
// Eager launches carry the values. A launch captured into a CUDA graph must not bake the values in (every
// replay would draw the same numbers), so it carries the ADDRESSES of two device-resident uint64 slots
// (seed, base offset) plus its own offset inside the graph; the kernel reads the slots when it runs, and the
// generator rewrites them before each replay (rng/generator.h). This is PyTorch's PhiloxCudaState.
// On the simulated device the addresses are host addresses and the host closure reads them when it runs.
// Each PhiloxArgs belongs to exactly one consumer kernel (its reservation is that kernel's counter range).
// Plain C++ and CUDA, no dependencies, so device kernels can take it by value.
#ifndef GRAPHALLOC_RNG_PHILOX_ARGS_H_
#define GRAPHALLOC_RNG_PHILOX_ARGS_H_

#include <cstdint>

#include "graphalloc/rng/philox.h"

namespace graphalloc {

struct PhiloxSeedOffset {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;  // in 32-bit words per thread (curand_init's offset)
};

struct PhiloxArgs {
  // Eager: the values. Unused when captured.
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  // Captured: device addresses of the uint64 seed and base-offset slots, and the offset inside the graph.
  std::uint64_t seed_address = 0;
  std::uint64_t offset_address = 0;
  std::uint64_t intragraph_offset = 0;
  bool captured = false;
  // The Generator that reserved eager values (its id; 0: made by hand). A random op refuses eager values of
  // a generator on a stream that is capturing a graph, naming the generator: the graph would replay them.
  std::uint64_t generator = 0;

  static constexpr PhiloxArgs Eager(std::uint64_t seed, std::uint64_t offset) {
    PhiloxArgs a;
    a.seed = seed;
    a.offset = offset;
    return a;
  }
  static constexpr PhiloxArgs Captured(std::uint64_t seed_address, std::uint64_t offset_address,
                                       std::uint64_t intragraph_offset) {
    PhiloxArgs a;
    a.seed_address = seed_address;
    a.offset_address = offset_address;
    a.intragraph_offset = intragraph_offset;
    a.captured = true;
    return a;
  }
};

// The (seed, offset) a kernel uses, read when the kernel runs: captured -> (*seed, *offset + intragraph).
GA_HD GA_INLINE PhiloxSeedOffset Unpack(const PhiloxArgs& args) {
  if (args.captured) {
    const auto* seed = reinterpret_cast<const std::uint64_t*>(static_cast<std::uintptr_t>(args.seed_address));
    const auto* offset =
        reinterpret_cast<const std::uint64_t*>(static_cast<std::uintptr_t>(args.offset_address));
    return PhiloxSeedOffset{*seed, *offset + args.intragraph_offset};
  }
  return PhiloxSeedOffset{args.seed, args.offset};
}

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_PHILOX_ARGS_H_
