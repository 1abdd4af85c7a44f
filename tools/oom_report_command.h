// `graphalloc oom-report SNAPSHOT`: why the out-of-memory error recorded in a snapshot's history happened,
// from the state the snapshot holds (allocator/snapshot/oom_report.h): the same explanation the
// allocator's own error gave, for a snapshot taken at the failure (`replay --capacity ... --snapshot X`
// writes X.oom.json; TakeSnapshot after an out-of-memory error with the history on).
#ifndef GRAPHALLOC_TOOLS_OOM_REPORT_COMMAND_H_
#define GRAPHALLOC_TOOLS_OOM_REPORT_COMMAND_H_

#include <CLI/CLI.hpp>

namespace graphalloc::tools {

// Registers the `oom-report` subcommand on `app`. Exit 0 with the report; 2 for a file that cannot be read
// or holds no out-of-memory event (the message says how to get one).
void AddOomReportCommand(CLI::App& app);

}  // namespace graphalloc::tools

#endif  // GRAPHALLOC_TOOLS_OOM_REPORT_COMMAND_H_
