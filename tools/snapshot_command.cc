// `graphalloc snapshot summary|segments|plot|diff|check|export-torch|import-torch`.
// Exit codes (tools/cli_common.h): 0 ok, 1 a failed check (check), 2 bad input or an output that could not
// be written. "-" reads a snapshot from stdin or writes an output to stdout.
#include "tools/snapshot_command.h"

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// A PyTorch pickle's device `device` (-1: the lowest with data). A pickle of several devices shows one of
// them: `note` then says which, and how to see another.
absl::StatusOr<MemorySnapshot> ReadPickle(const std::string& bytes, const std::string& path, int device,
                                          std::string* note) {
  std::vector<int> devices;
  absl::StatusOr<MemorySnapshot> s = SnapshotFromTorchPickle(bytes, path, device, &devices);
  if (s.ok() && device < 0 && devices.size() > 1 && note != nullptr) {
    *note = absl::StrCat(path, " holds devices ", absl::StrJoin(devices, ", "), "; this is device ",
                         s->device.ordinal, " (--device N shows another)");
  }
  return s;
}

absl::StatusOr<MemorySnapshot> ParseAnySnapshot(const std::string& bytes, const std::string& path, int device,
                                                std::string* note) {
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80)
    return ReadPickle(bytes, path, device, note);
  absl::StatusOr<MemorySnapshot> s = SnapshotFromJson(bytes, path);
  if (s.ok() && device >= 0 && device != s->device.ordinal) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a graphalloc snapshot of device ",
                                                   s->device.ordinal, " alone; --device ", device,
                                                   " names another"));
  }
  return s;
}

MemorySnapshot LoadOrFail(absl::string_view command, const std::string& path, int device) {
  const std::string name = absl::StrCat("snapshot ", command);
  std::string note;
  absl::StatusOr<MemorySnapshot> s = LoadAnySnapshot(path, device, &note);
  if (!s.ok()) Fail(name, kExitBadInput, s.status().message());
  if (!note.empty()) std::cerr << "graphalloc " << name << ": " << note << "\n";
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

// --device N: which device of a PyTorch pickle to show (default: the lowest with data, and the choice is
// said on stderr when there are several).
void AddDeviceOption(CLI::App* command, const std::shared_ptr<SnapshotCliOptions>& options) {
  command
      ->add_option("--device", options->device,
                   "A PyTorch pickle's device to show (default: the lowest with data; stderr says so when "
                   "the pickle holds several)")
      ->check(NonNegative());
}

CLI::App* AddFileCommand(CLI::App* parent, const std::string& name, const std::string& help,
                         const std::shared_ptr<SnapshotCliOptions>& options) {
  CLI::App* command = parent->add_subcommand(name, help);
  command
      ->add_option("file", options->file, "Snapshot file (graphalloc JSON, or a PyTorch pickle; - for stdin)")
      ->required();
  AddDeviceOption(command, options);
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

absl::StatusOr<MemorySnapshot> LoadAnySnapshot(const std::string& path, int device, std::string* note) {
  absl::StatusOr<std::string> bytes = ReadInput(path);
  if (!bytes.ok()) return bytes.status();
  return ParseAnySnapshot(*bytes, path == "-" ? "(stdin)" : path, device, note);
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
    const MemorySnapshot s = LoadOrFail("summary", options->file, options->device);
    std::cout << (options->json ? RenderSummaryJson(s, options->top)
                                : RenderSummaryText(s, options->file, options->top, *brief));
  });

  CLI::App* segments =
      AddFileCommand(snapshot, "segments", "A text map of each segment, block by block", options);
  AddJsonFlag(segments, options);
  segments->callback([options] {
    const MemorySnapshot s = LoadOrFail("segments", options->file, options->device);
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
    const MemorySnapshot s = LoadOrFail("plot", options->file, options->device);
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
  AddDeviceOption(diff, options);
  AddJsonFlag(diff, options);
  diff->callback([options] {
    if (options->file == "-" && options->other == "-") {
      Fail("snapshot diff", kExitBadInput, "only one of the two snapshots can be read from stdin (-)");
    }
    const MemorySnapshot a = LoadOrFail("diff", options->file, options->device);
    const MemorySnapshot b = LoadOrFail("diff", options->other, options->device);
    std::cout << (options->json ? RenderDiffJson(a, b)
                                : RenderDiffText(a, b, options->file, options->other, options->top));
  });

  CLI::App* check = AddFileCommand(
      snapshot, "check",
      "Check the snapshot's invariants and that its statistics agree with its blocks (exit 1 if not)",
      options);
  AddJsonFlag(check, options);
  check->callback([options] {
    const MemorySnapshot s = LoadOrFail("check", options->file, options->device);
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
    const MemorySnapshot s = LoadOrFail("export-torch", options->file, options->device);
    WriteOrFail("export-torch", options->output, SnapshotToTorchPickle(s));
    ReportWritten(options->output, "");
  });

  CLI::App* import_torch = snapshot->add_subcommand(
      "import-torch", "Convert a snapshot written by torch.cuda.memory._dump_snapshot() to graphalloc JSON");
  import_torch->add_option("pickle", options->file, "IN.pickle (- for stdin)")->required();
  import_torch->add_option("-o,--output", options->output, "OUT.json; - for stdout")->required();
  AddDeviceOption(import_torch, options);
  import_torch->callback([options] {
    absl::StatusOr<std::string> bytes = ReadInput(options->file);
    if (!bytes.ok()) Fail("snapshot import-torch", kExitBadInput, bytes.status().message());
    std::string note;
    absl::StatusOr<MemorySnapshot> read =
        ReadPickle(*bytes, options->file == "-" ? "(stdin)" : options->file, options->device, &note);
    if (!read.ok()) Fail("snapshot import-torch", kExitBadInput, read.status().message());
    if (!note.empty()) std::cerr << "graphalloc snapshot import-torch: " << note << "\n";
    const MemorySnapshot& s = *read;
    WriteOrFail("import-torch", options->output, SnapshotToJson(s));
    ReportWritten(options->output,
                  absl::StrCat(" (", s.segments.size(), " segments, ", s.history.size(), " history events)"));
  });
}

}  // namespace graphalloc::tools
