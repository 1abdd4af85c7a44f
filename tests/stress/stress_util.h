// Helpers shared by the stress tests: the seed (printed, replayable) and scaled operation counts.
#ifndef GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_
#define GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_

#include <cstdint>
#include <cstdlib>

namespace graphalloc::testing {

// GRAPHALLOC_TEST_SEED when set (to replay a failing run), else `fallback`.
inline std::uint64_t StressSeed(std::uint64_t fallback) {
  const char* text = std::getenv("GRAPHALLOC_TEST_SEED");
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// `base` operations, times GRAPHALLOC_STRESS_SCALE when set (a soak: GRAPHALLOC_STRESS_SCALE=100).
inline int StressOps(int base) {
  const char* text = std::getenv("GRAPHALLOC_STRESS_SCALE");
  const double scale = text != nullptr && *text != '\0' ? std::strtod(text, nullptr) : 1.0;
  return scale > 0 ? static_cast<int>(base * scale) : base;
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_STRESS_STRESS_UTIL_H_
