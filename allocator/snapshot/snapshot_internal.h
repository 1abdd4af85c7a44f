// Internal to the snapshot readers and writers: UTF-8 checks and repair.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace graphalloc::snapshot_internal {

// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when it is not one.
std::size_t Utf8SequenceLength(absl::string_view s, std::size_t i);
// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string ToValidUtf8(absl::string_view s);

}  // namespace graphalloc::snapshot_internal

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
