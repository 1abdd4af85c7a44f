// `graphalloc snapshot ...`: inspect memory snapshots (graphalloc JSON, or PyTorch pickles directly):
// summary, segments, plot, diff, check, export-torch and import-torch. docs/snapshot_format.md has usage.
#ifndef GRAPHALLOC_TOOLS_SNAPSHOT_COMMAND_H_
#define GRAPHALLOC_TOOLS_SNAPSHOT_COMMAND_H_

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/snapshot/memory_snapshot.h"

namespace graphalloc::tools {

// Registers the `snapshot` subcommand group on `app`. A callback prints its result and throws
// CLI::RuntimeError(1) for a failed check, CLI::RuntimeError(2) for bad input (missing, corrupt, truncated
// or wrong-version files) or an output that cannot be written.
void AddSnapshotCommand(CLI::App& app);

// Reads a snapshot file ("-": stdin): graphalloc JSON, or a PyTorch memory snapshot pickle (recognized by
// its first byte, the pickle PROTO opcode). `device`: a pickle's device to keep (-1: the lowest with data);
// for a graphalloc snapshot, -1 or its own device. When a pickle holds several devices and `device` is -1,
// `note` (if given) says which one this is.
absl::StatusOr<MemorySnapshot> LoadAnySnapshot(const std::string& path, int device = -1,
                                               std::string* note = nullptr);

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_SNAPSHOT_COMMAND_H_
