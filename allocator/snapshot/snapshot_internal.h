// Internal to the snapshot readers and writers: UTF-8 checks and repair, and the paths and errors of the
// readers (JSON and pickle), which name where in the input a bad value is ("segments[2].blocks[0].size").
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace graphalloc::snapshot_internal {

// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when it is not one.
std::size_t Utf8SequenceLength(absl::string_view s, std::size_t i);
// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string ToValidUtf8(absl::string_view s);

// The path of member `key` of the value at `path` ("stats.allocation"; just `key` at the top level).
inline std::string ChildPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}
// The path of element `i` of the list at `path` ("segments[2]").
inline std::string IndexPath(absl::string_view path, std::size_t i) {
  return absl::StrCat(path, "[", i, "]");
}
// A reader's error: InvalidArgument "<path>: <what>".
inline absl::Status ReadError(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}
// "<path>: expected <expected>, found <found>", `found` the type the input has there.
inline absl::Status ReadTypeError(absl::string_view path, absl::string_view expected,
                                  absl::string_view found) {
  return ReadError(path, absl::StrCat("expected ", expected, ", found ", found));
}

}  // namespace graphalloc::snapshot_internal

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_INTERNAL_H_
