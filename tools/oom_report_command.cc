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
  auto device = std::make_shared<int>(-1);
  CLI::App* command = app.add_subcommand(
      "oom-report",
      "Why the out-of-memory error recorded in a snapshot happened: the request, the device's memory, what "
      "held the memory (largest cause first) and what to try");
  command
      ->add_option("snapshot", *file,
                   "A snapshot taken at the failure, with its history (replay --capacity ... --snapshot X "
                   "writes X.oom.json); graphalloc JSON or a PyTorch pickle; - for stdin")
      ->required();
  command->add_option("--device", *device, "A PyTorch pickle's device (default: the lowest with data)")
      ->check(NonNegative());
  command->callback([file, device] {
    std::string note;
    absl::StatusOr<MemorySnapshot> snapshot = LoadAnySnapshot(*file, *device, &note);
    if (!snapshot.ok()) Fail("oom-report", kExitBadInput, snapshot.status().message());
    if (!note.empty()) std::cerr << "graphalloc oom-report: " << note << "\n";
    absl::StatusOr<OomRequest> request = OomRequestFromHistory(*snapshot);
    if (!request.ok())
      Fail("oom-report", kExitBadInput, absl::StrCat(*file, ": ", request.status().message()));
    std::cout << FormatOomReport(ExplainOutOfMemory(*snapshot, *request));
  });
}

}  // namespace graphalloc::tools
