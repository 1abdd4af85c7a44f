// `graphalloc snapshot summary|segments|plot|diff|check|export-torch|import-torch`.
// Exit codes (tools/cli_common.h): 0 ok, 1 a failed check (check), 2 bad input or an output that could not
// be written. "-" reads a snapshot from stdin or writes an output to stdout.
#include "tools/snapshot_command.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/snapshot/torch_snapshot.h"
#include "tools/cli_common.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

struct SnapshotCliOptions {
  std::string file;
  std::string other;
  std::string output;
  bool json = false;
  int top = 10;
  int device = -1;
};

absl::StatusOr<MemorySnapshot> ParseAnySnapshot(const std::string& bytes, const std::string& path) {
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80)
    return SnapshotFromTorchPickle(bytes, path);
  return SnapshotFromJson(bytes, path);
}

MemorySnapshot LoadOrFail(absl::string_view command, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadInput(path);
  if (!bytes.ok()) Fail(absl::StrCat("snapshot ", command), kExitBadInput, bytes.status().message());
  absl::StatusOr<MemorySnapshot> s = ParseAnySnapshot(*bytes, path == "-" ? "(stdin)" : path);
  if (!s.ok()) Fail(absl::StrCat("snapshot ", command), kExitBadInput, s.status().message());
  return *std::move(s);
}

void WriteOrFail(absl::string_view command, const std::string& path, absl::string_view bytes) {
  if (absl::Status s = WriteOutput(path, bytes); !s.ok()) {
    Fail(absl::StrCat("snapshot ", command), kExitCannotWrite, s.message());
  }
}

// "wrote PATH (...)": on stderr when the output itself went to stdout, so a pipe gets only the output.
void ReportWritten(const std::string& path, absl::string_view details) {
  (path == "-" ? std::cerr : std::cout) << "wrote " << (path == "-" ? "stdout" : path) << details << "\n";
}

CLI::App* AddFileCommand(CLI::App* parent, const std::string& name, const std::string& help,
                         const std::shared_ptr<SnapshotCliOptions>& options) {
  CLI::App* command = parent->add_subcommand(name, help);
  command
      ->add_option("file", options->file, "Snapshot file (graphalloc JSON, or a PyTorch pickle; - for stdin)")
      ->required();
  return command;
}

void AddJsonFlag(CLI::App* command, const std::shared_ptr<SnapshotCliOptions>& options) {
  command->add_flag("--json", options->json, "Print the result as one JSON object");
}

void AddTopOption(CLI::App* command, const std::shared_ptr<SnapshotCliOptions>& options,
                  const std::string& help) {
  command->add_option("--top", options->top, help)->check(NonNegative())->capture_default_str();
}

}  // namespace

absl::StatusOr<MemorySnapshot> LoadAnySnapshot(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadInput(path);
  if (!bytes.ok()) return bytes.status();
  return ParseAnySnapshot(*bytes, path);
}

void AddSnapshotCommand(CLI::App& app) {
  auto options = std::make_shared<SnapshotCliOptions>();
  CLI::App* snapshot = app.add_subcommand(
      "snapshot",
      "Inspect memory snapshots: summary, segment map, pictures, diffs, PyTorch memory_viz interop");
  snapshot->require_subcommand(1);

  CLI::App* summary =
      AddFileCommand(snapshot, "summary",
                     "Totals, per pool and per stream, fragmentation, largest free block, top "
                     "allocations by size and by call site",
                     options);
  AddJsonFlag(summary, options);
  AddTopOption(summary, options, "Length of the top-N lists");
  auto brief = std::make_shared<bool>(false);
  summary->add_flag("--brief", *brief, "Only the totals, the top allocations and the history's length");
  summary->callback([options, brief] {
    const MemorySnapshot s = LoadOrFail("summary", options->file);
    std::cout << (options->json ? RenderSummaryJson(s, options->top)
                                : RenderSummaryText(s, options->file, options->top, *brief));
  });

  CLI::App* segments =
      AddFileCommand(snapshot, "segments", "A text map of each segment, block by block", options);
  AddJsonFlag(segments, options);
  segments->callback([options] {
    const MemorySnapshot s = LoadOrFail("segments", options->file);
    std::cout << (options->json ? RenderSegmentsJson(s) : RenderSegmentsText(s));
  });

  CLI::App* plot = AddFileCommand(snapshot, "plot",
                                  "Draw the segment map and the memory timeline: an SVG, or a self-contained "
                                  "HTML page (chosen by the output's extension; with -o -, --format)",
                                  options);
  plot->add_option("-o,--output", options->output, "OUT.svg or OUT.html; - for stdout (HTML unless --svg)")
      ->required();
  auto svg_to_stdout = std::make_shared<bool>(false);
  plot->add_flag("--svg", *svg_to_stdout, "With -o -: write SVG instead of HTML");
  plot->callback([options, svg_to_stdout] {
    const bool to_stdout = options->output == "-";
    const bool html =
        to_stdout ? !*svg_to_stdout
                  : absl::EndsWith(options->output, ".html") || absl::EndsWith(options->output, ".htm");
    if (!to_stdout && !html && !absl::EndsWith(options->output, ".svg")) {
      Fail("snapshot plot", kExitBadInput,
           absl::StrCat("-o ", options->output, ": the output must end in .svg or .html (or be -)"));
    }
    const MemorySnapshot s = LoadOrFail("plot", options->file);
    Progress progress("graphalloc snapshot plot: drawing");
    WriteOrFail("plot", options->output, html ? RenderHtml(s, options->file) : RenderSvg(s, options->file));
    ReportWritten(options->output,
                  absl::StrCat(" (", s.segments.size(), " segments, ", s.history.size(), " history events)"));
  });

  CLI::App* diff = snapshot->add_subcommand(
      "diff",
      "What changed between two snapshots: segments and blocks added/removed, bytes per pool and call site");
  diff->add_option("before", options->file, "The earlier snapshot (- for stdin)")->required();
  diff->add_option("after", options->other, "The later snapshot")->required();
  AddTopOption(diff, options, "Length of each list");
  AddJsonFlag(diff, options);
  diff->callback([options] {
    if (options->file == "-" && options->other == "-") {
      Fail("snapshot diff", kExitBadInput, "only one of the two snapshots can be read from stdin (-)");
    }
    const MemorySnapshot a = LoadOrFail("diff", options->file);
    const MemorySnapshot b = LoadOrFail("diff", options->other);
    std::cout << (options->json ? RenderDiffJson(a, b)
                                : RenderDiffText(a, b, options->file, options->other, options->top));
  });

  CLI::App* check = AddFileCommand(
      snapshot, "check",
      "Check the snapshot's invariants and that its statistics agree with its blocks (exit 1 if not)",
      options);
  AddJsonFlag(check, options);
  check->callback([options] {
    const MemorySnapshot s = LoadOrFail("check", options->file);
    const absl::Status st = CheckStatsConsistency(s);
    if (options->json) {
      nlohmann::json out = {{"file", options->file},
                            {"ok", st.ok()},
                            {"segments", s.segments.size()},
                            {"history_events", s.history.size()}};
      if (!st.ok()) out["error"] = std::string(st.message());
      std::cout << out.dump(2) << "\n";
      if (!st.ok()) throw CLI::RuntimeError(kExitFailed);
      return;
    }
    if (!st.ok()) Fail("snapshot check", kExitFailed, st.message());
    std::cout << options->file << ": ok (" << s.segments.size() << " segments, " << s.history.size()
              << " history events)\n";
  });

  CLI::App* export_torch = AddFileCommand(
      snapshot, "export-torch",
      "Write PyTorch's memory snapshot pickle (opens in pytorch.org/memory_viz and torch.cuda._memory_viz)",
      options);
  export_torch->add_option("-o,--output", options->output, "OUT.pickle; - for stdout")->required();
  export_torch->callback([options] {
    const MemorySnapshot s = LoadOrFail("export-torch", options->file);
    WriteOrFail("export-torch", options->output, SnapshotToTorchPickle(s));
    ReportWritten(options->output, "");
  });

  CLI::App* import_torch = snapshot->add_subcommand(
      "import-torch", "Convert a snapshot written by torch.cuda.memory._dump_snapshot() to graphalloc JSON");
  import_torch->add_option("pickle", options->file, "IN.pickle (- for stdin)")->required();
  import_torch->add_option("-o,--output", options->output, "OUT.json; - for stdout")->required();
  import_torch
      ->add_option("--device", options->device,
                   "Device to keep (default: the lowest with data); an error when it has none")
      ->check(NonNegative());
  import_torch->callback([options] {
    absl::StatusOr<std::string> bytes = ReadInput(options->file);
    if (!bytes.ok()) Fail("snapshot import-torch", kExitBadInput, bytes.status().message());
    absl::StatusOr<MemorySnapshot> s = SnapshotFromTorchPickle(*bytes, options->file, options->device);
    if (!s.ok()) Fail("snapshot import-torch", kExitBadInput, s.status().message());
    WriteOrFail("import-torch", options->output, SnapshotToJson(*s));
    ReportWritten(options->output, absl::StrCat(" (", s->segments.size(), " segments, ", s->history.size(),
                                                " history events)"));
  });
}

}  // namespace graphalloc::tools
