// Helpers shared by the RNG tests: device buffers, copies, and the expected element -> Philox word
// mapping written out independently of rng/launch_policy.h.
#ifndef GRAPHALLOC_TESTS_RNG_RNG_TEST_UTIL_H_
#define GRAPHALLOC_TESTS_RNG_RNG_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/rng/philox.h"

namespace graphalloc::rng_test {

// A device allocation freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(Driver& driver, std::size_t bytes) : driver_(driver), bytes_(bytes) {
    auto ptr = driver.MemAlloc(bytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    if (ptr.ok()) ptr_ = *ptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != 0) {
      EXPECT_TRUE(driver_.MemFree(ptr_).ok());
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DevicePtr get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

  template <typename T>
  std::vector<T> Read() const {
    std::vector<T> out(bytes_ / sizeof(T));
    absl::Status s = driver_.CopyDeviceToHost(out.data(), ptr_, out.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  template <typename T>
  void Write(const std::vector<T>& values) const {
    absl::Status s = driver_.CopyHostToDevice(ptr_, values.data(), values.size() * sizeof(T));
    EXPECT_TRUE(s.ok()) << s;
  }

 private:
  Driver& driver_;
  std::size_t bytes_;
  DevicePtr ptr_ = 0;
};

// Threads of a launch over n elements: min(ceil(n / 256), 1056) blocks of 256 (PyTorch-style fixed grid).
inline std::uint64_t ExpectedThreads(std::uint64_t n) {
  std::uint64_t blocks = (n + 255) / 256;
  if (blocks == 0) blocks = 1;
  if (blocks > 1056) blocks = 1056;
  return blocks * 256;
}

// The curand() word element i of an n-element launch with (seed, offset) gets: thread t = i % T is
// subsequence t; iteration j = i / 4T uses the four words after skipping offset + 4j; word (i % 4T) / T.
inline std::uint32_t ExpectedWord(std::uint64_t seed, std::uint64_t offset, std::uint64_t i,
                                  std::uint64_t n) {
  const std::uint64_t t_count = ExpectedThreads(n);
  const std::uint64_t thread = i % t_count;
  const std::uint64_t iteration = i / (4 * t_count);
  const int word = static_cast<int>((i % (4 * t_count)) / t_count);
  PhiloxStream stream(seed, thread, offset + 4 * iteration);
  return stream.Next4()[word];
}

inline std::uint32_t Bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace graphalloc::rng_test

#endif  // GRAPHALLOC_TESTS_RNG_RNG_TEST_UTIL_H_
