#include "tests/testing/device_memory.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"

namespace graphalloc::testing {
namespace {

constexpr std::size_t kWhole = 64 * 1024;
constexpr std::size_t kPiece = 16 * 1024;

std::uint64_t Word(std::uint64_t id, std::size_t offset) {
  return (id * 0x9E3779B97F4A7C15ull) ^ (offset * 0xBF58476D1CE4E5B9ull);
}

// The byte ranges the pattern covers: [offset, offset + length).
std::vector<std::pair<std::size_t, std::size_t>> Ranges(std::size_t size) {
  if (size <= kWhole) return {{0, size}};
  const std::size_t middle = (size / 2) & ~std::size_t{7};
  return {{0, kPiece}, {middle, std::min(kPiece, size - middle)}, {size - kPiece, kPiece}};
}

std::vector<std::uint64_t> Expected(std::uint64_t id, std::size_t offset, std::size_t length) {
  std::vector<std::uint64_t> words(length / 8);
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = Word(id, offset + i * 8);
  return words;
}

}  // namespace

absl::Status FillPattern(Driver& driver, DevicePtr ptr, std::size_t size, std::uint64_t id) {
  for (auto [offset, length] : Ranges(size)) {
    std::vector<std::uint64_t> words = Expected(id, offset, length);
    if (absl::Status s = driver.CopyHostToDevice(ptr + offset, words.data(), words.size() * 8); !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status CheckPattern(Driver& driver, DevicePtr ptr, std::size_t size, std::uint64_t id) {
  for (auto [offset, length] : Ranges(size)) {
    std::vector<std::uint64_t> expected = Expected(id, offset, length);
    std::vector<std::uint64_t> actual(expected.size());
    if (absl::Status s = driver.CopyDeviceToHost(actual.data(), ptr + offset, actual.size() * 8); !s.ok())
      return s;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      if (actual[i] != expected[i]) {
        return absl::DataLossError(
            absl::StrFormat("block 0x%x (id %d): word at offset %d is 0x%x, expected 0x%x", ptr, id,
                            offset + i * 8, actual[i], expected[i]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace graphalloc::testing
