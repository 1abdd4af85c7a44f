#include "tools/oom_report_command.h"

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/oom_report.h"
#include "tools/cli_common.h"
#include "tools/snapshot_command.h"

namespace graphalloc::tools {

void AddOomReportCommand(CLI::App& app) {
  auto file = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand(
      "oom-report",
      "Why the out-of-memory error recorded in a snapshot happened: the request, the device's memory, what "
      "held the memory (largest cause first) and what to try");
  command
      ->add_option("snapshot", *file,
                   "A snapshot taken at the failure, with its history (replay --capacity ... --snapshot X "
                   "writes X.oom.json); graphalloc JSON or a PyTorch pickle; - for stdin")
      ->required();
  command->callback([file] {
    absl::StatusOr<MemorySnapshot> snapshot = LoadAnySnapshot(*file);
    if (!snapshot.ok()) Fail("oom-report", kExitBadInput, snapshot.status().message());
    absl::StatusOr<OomRequest> request = OomRequestFromHistory(*snapshot);
    if (!request.ok())
      Fail("oom-report", kExitBadInput, absl::StrCat(*file, ": ", request.status().message()));
    std::cout << FormatOomReport(ExplainOutOfMemory(*snapshot, *request));
  });
}

}  // namespace graphalloc::tools
