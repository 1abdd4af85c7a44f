// Seeds and run lengths of randomized and long tests, from the environment, for every test directory:
//   GRAPHALLOC_TEST_SEED    replays a randomized test's run (each such test prints its seed);
//   GRAPHALLOC_TEST_SCALE   scales operation counts and sizes: scripts/test.sh sets it below 1 for the
//                           sanitizer builds, which run every operation several times slower to check
//                           memory and races rather than more states (the normal build keeps the counts
//                           the issues ask for).
#ifndef GRAPHALLOC_TESTS_TESTING_TEST_SCALE_H_
#define GRAPHALLOC_TESTS_TESTING_TEST_SCALE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace graphalloc::testing {

// GRAPHALLOC_TEST_SEED when set (to replay a failing run), else `fallback`.
inline std::uint64_t TestSeed(std::uint64_t fallback) {
  const char* text = std::getenv("GRAPHALLOC_TEST_SEED");
  return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : fallback;
}

// A positive number from the environment variable `name`, or 1.
inline double ScaleFromEnvironment(const char* name) {
  const char* text = std::getenv(name);
  const double scale = text != nullptr && *text != '\0' ? std::strtod(text, nullptr) : 1.0;
  return scale > 0 ? scale : 1.0;
}

// GRAPHALLOC_TEST_SCALE, or 1.
inline double TestScale() { return ScaleFromEnvironment("GRAPHALLOC_TEST_SCALE"); }

// `base` operations times GRAPHALLOC_TEST_SCALE times `extra`, and at least `at_least`.
inline int ScaledCount(int base, double extra = 1.0, int at_least = 1) {
  return std::max(at_least, static_cast<int>(base * TestScale() * extra));
}

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_TEST_SCALE_H_
