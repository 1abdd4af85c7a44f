#include "graphalloc/graph/input_mutation_check.h"

#include <cstring>

namespace graphalloc {

absl::Status InputMutationCheck::Before(std::size_t index, BufferView buffer) {
  Saved& saved = saved_.emplace_back();
  saved.index = index;
  saved.buffer = buffer;
  saved.bytes.resize(buffer.bytes);
  return driver_.CopyDeviceToHost(saved.bytes.data(), buffer.ptr, buffer.bytes);
}

absl::StatusOr<std::optional<std::size_t>> InputMutationCheck::FirstChanged() {
  std::vector<std::uint8_t> now;
  for (const Saved& saved : saved_) {
    now.resize(saved.buffer.bytes);
    if (absl::Status s = driver_.CopyDeviceToHost(now.data(), saved.buffer.ptr, saved.buffer.bytes);
        !s.ok()) {
      return s;
    }
    if (std::memcmp(now.data(), saved.bytes.data(), now.size()) != 0) return saved.index;
  }
  return std::nullopt;
}

}  // namespace graphalloc
