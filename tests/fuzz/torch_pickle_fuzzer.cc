// libFuzzer target: the pickle reader and the PyTorch memory-snapshot importer (allocator/snapshot/
// pickle.h, torch_snapshot.h). Any input must give a value (or a validated MemorySnapshot) or an
// InvalidArgument error naming where, never a crash, a throw, unbounded recursion or a sanitizer report.
// An imported snapshot must survive the trip through graphalloc's own JSON format and back to a pickle.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"
#include "graphalloc/allocator/snapshot/pickle.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"

namespace {

[[noreturn]] void Fail(const char* what, absl::string_view detail) {
  std::fprintf(stderr, "torch_pickle_fuzzer: %s: %.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<graphalloc::PickleDocument>> document =
      graphalloc::ParsePickle(bytes, "fuzz.pickle");
  if (!document.ok() && !absl::IsInvalidArgument(document.status())) {
    Fail("pickle error is not InvalidArgument", document.status().ToString());
  }
  absl::StatusOr<graphalloc::MemorySnapshot> snapshot =
      graphalloc::SnapshotFromTorchPickle(bytes, "fuzz.pickle");
  if (!snapshot.ok()) {
    if (!absl::IsInvalidArgument(snapshot.status()))
      Fail("import error is not InvalidArgument", snapshot.status().ToString());
    return 0;
  }
  if (!document.ok())
    Fail("imported a snapshot from a pickle ParsePickle refuses", document.status().ToString());
  if (absl::Status s = graphalloc::ValidateSnapshot(*snapshot); !s.ok())
    Fail("imported an invalid snapshot", s.ToString());
  const std::string json = graphalloc::SnapshotToJson(*snapshot);
  absl::StatusOr<graphalloc::MemorySnapshot> from_json = graphalloc::SnapshotFromJson(json, "imported.json");
  if (!from_json.ok()) Fail("an imported snapshot does not survive JSON", from_json.status().ToString());
  const std::string pickle = graphalloc::SnapshotToTorchPickle(*snapshot);
  absl::StatusOr<graphalloc::MemorySnapshot> back =
      graphalloc::SnapshotFromTorchPickle(pickle, "exported.pickle");
  if (!back.ok())
    Fail("an imported snapshot does not export to a pickle that imports", back.status().ToString());
  return 0;
}
