// `graphalloc replay TRACE`: replays an allocation trace through graphalloc on the simulated or the real
// device and reports peak live against peak reserved bytes, whether it completed, and time per operation.
#ifndef GRAPHALLOC_TOOLS_REPLAY_COMMAND_H_
#define GRAPHALLOC_TOOLS_REPLAY_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace graphalloc::tools {

// Registers the `replay` subcommand on `app`. Its callback prints the result and throws
// CLI::RuntimeError(1) when the replay did not complete, CLI::RuntimeError(2) for bad input.
void AddReplayCommand(CLI::App& app);

// Parses a byte count: plain bytes ("1048576") or a number with a unit ("7.5GiB", "300MiB", "512KiB",
// "2GB" = 2e9). InvalidArgument for anything else, zero, or more than 2^63 bytes.
absl::StatusOr<std::size_t> ParseByteSize(absl::string_view text);

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_REPLAY_COMMAND_H_
