// Memory snapshots as JSON files: the versioned "graphalloc-snapshot" format of docs/snapshot_format.md.
//
// The writer is a hand-rolled streaming writer (a million history events in well under a second); stacks
// are de-duplicated into one table that blocks, segments and events refer to by index. The reader parses
// with nlohmann_json, converting history events as they stream by so that a large history never exists as
// a JSON tree, then checks the snapshot's invariants (ValidateSnapshot). Bad input is always an
// InvalidArgument error naming where it is: a byte offset, line and column for malformed JSON, a JSON path
// ("segments[3].blocks[7].size") for a well-formed file with a wrong or missing field. Nothing throws.
#ifndef GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_JSON_H_
#define GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_JSON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc {

// The value of the file's "format" field.
inline constexpr absl::string_view kSnapshotFormatName = "graphalloc-snapshot";

// The snapshot as JSON text (one block or history event a line). Strings that are not valid UTF-8 are
// written with U+FFFD in place of the bad bytes.
std::string SnapshotToJson(const MemorySnapshot& snapshot);

// Writes SnapshotToJson() to `path` (replacing it). An error names the path and the reason.
absl::Status WriteSnapshotFile(const MemorySnapshot& snapshot, const std::string& path);

// Parses a snapshot from JSON text and validates it. `source` (a file name) starts every error message.
// InvalidArgument for malformed JSON (with byte offset, line and column), a missing or wrong "format", a
// "version" other than kSnapshotFormatVersion, a missing or mistyped field (with its JSON path), or a
// snapshot that breaks an invariant (ValidateSnapshot's path).
absl::StatusOr<MemorySnapshot> SnapshotFromJson(absl::string_view json,
                                                absl::string_view source = "snapshot");

// Reads and parses a snapshot file. NotFound when it cannot be opened; otherwise as SnapshotFromJson.
absl::StatusOr<MemorySnapshot> ReadSnapshotFile(const std::string& path);

// Reads a whole file into memory. NotFound when it cannot be opened, DataLoss on a read error.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);
// Writes `bytes` to `path`, replacing it. Internal error naming the path on failure.
absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes);

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_SNAPSHOT_SNAPSHOT_JSON_H_
