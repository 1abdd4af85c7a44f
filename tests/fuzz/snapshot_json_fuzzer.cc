// libFuzzer target: the memory-snapshot JSON reader (allocator/snapshot/snapshot_json.h). Any input must
// give a validated MemorySnapshot or an InvalidArgument error, never a crash, a throw or a sanitizer
// report. A snapshot that was read must write (SnapshotToJson) to text that reads back to an equal
// snapshot, and writing that again must give the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"

namespace {

[[noreturn]] void Fail(const char* what, absl::string_view detail) {
  std::fprintf(stderr, "snapshot_json_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const absl::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<graphalloc::MemorySnapshot> snapshot = graphalloc::SnapshotFromJson(json, "fuzz.json");
  if (!snapshot.ok()) {
    if (!absl::IsInvalidArgument(snapshot.status()))
      Fail("error is not InvalidArgument", snapshot.status().ToString());
    return 0;
  }
  if (absl::Status s = graphalloc::ValidateSnapshot(*snapshot); !s.ok())
    Fail("read an invalid snapshot", s.ToString());
  const std::string written = graphalloc::SnapshotToJson(*snapshot);
  absl::StatusOr<graphalloc::MemorySnapshot> again = graphalloc::SnapshotFromJson(written, "written.json");
  if (!again.ok()) Fail("SnapshotToJson output does not read back", again.status().ToString());
  const std::string rewritten = graphalloc::SnapshotToJson(*again);
  if (rewritten != written) Fail("writing the snapshot read back gives other text", rewritten);
  return 0;
}
