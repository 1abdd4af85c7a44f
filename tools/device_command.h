// `graphalloc device`: the device self-check (which device was found, its memory, a VMM round trip).
#ifndef GRAPHALLOC_TOOLS_DEVICE_COMMAND_H_
#define GRAPHALLOC_TOOLS_DEVICE_COMMAND_H_

#include <CLI/CLI.hpp>

namespace graphalloc::tools {

// Registers the `device` subcommand on `app`. Its callback prints the self-check and, when a check fails,
// throws CLI::RuntimeError(1), which main() turns into the exit code.
void AddDeviceCommand(CLI::App& app);

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_DEVICE_COMMAND_H_
