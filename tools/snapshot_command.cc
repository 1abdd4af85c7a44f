// `graphalloc snapshot summary|segments|plot|diff|check|export-torch|import-torch`.
// Exit codes: 0 ok, 1 a failed check (check) or a file that could not be written, 2 bad input.
#include "tools/snapshot_command.h"

#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/snapshot/snapshot_json.h"
#include "allocator/snapshot/torch_snapshot.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

constexpr int kExitFailed = 1;
constexpr int kExitBadInput = 2;

struct SnapshotCliOptions {
  std::string file;
  std::string other;
  std::string output;
  bool json = false;
  int top = 10;
  int device = -1;
};

[[noreturn]] void Fail(absl::string_view command, int code, absl::string_view message) {
  std::cerr << "graphalloc snapshot " << command << ": " << message << "\n";
  throw CLI::RuntimeError(code);
}

MemorySnapshot LoadOrFail(absl::string_view command, const std::string& path) {
  absl::StatusOr<MemorySnapshot> s = LoadAnySnapshot(path);
  if (!s.ok()) Fail(command, kExitBadInput, s.status().message());
  return *std::move(s);
}

void WriteOrFail(absl::string_view command, const std::string& path, absl::string_view bytes) {
  if (absl::Status s = WriteFileBytes(path, bytes); !s.ok()) Fail(command, kExitFailed, s.message());
}

CLI::App* AddFileCommand(CLI::App* parent, const std::string& name, const std::string& help,
                         const std::shared_ptr<SnapshotCliOptions>& options) {
  CLI::App* command = parent->add_subcommand(name, help);
  command->add_option("file", options->file, "Snapshot file (graphalloc JSON, or a PyTorch pickle)")
      ->required();
  return command;
}

}  // namespace

absl::StatusOr<MemorySnapshot> LoadAnySnapshot(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  if (!bytes->empty() && static_cast<unsigned char>((*bytes)[0]) == 0x80) {
    return SnapshotFromTorchPickle(*bytes, path);
  }
  return SnapshotFromJson(*bytes, path);
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
  summary->add_flag("--json", options->json, "Print the numbers as one JSON object");
  summary->add_option("--top", options->top, "Length of the top-N lists")->capture_default_str();
  summary->callback([options] {
    const MemorySnapshot s = LoadOrFail("summary", options->file);
    std::cout << (options->json ? RenderSummaryJson(s, options->top)
                                : RenderSummaryText(s, options->file, options->top));
  });

  CLI::App* segments =
      AddFileCommand(snapshot, "segments", "A text map of each segment, block by block", options);
  segments->callback([options] { std::cout << RenderSegmentsText(LoadOrFail("segments", options->file)); });

  CLI::App* plot = AddFileCommand(snapshot, "plot",
                                  "Draw the segment map and the memory timeline: an SVG, or a self-contained "
                                  "HTML page (chosen by the output's extension)",
                                  options);
  plot->add_option("-o,--output", options->output, "OUT.svg or OUT.html")->required();
  plot->callback([options] {
    const bool html = absl::EndsWith(options->output, ".html") || absl::EndsWith(options->output, ".htm");
    if (!html && !absl::EndsWith(options->output, ".svg")) {
      Fail("plot", kExitBadInput,
           absl::StrCat("-o ", options->output, ": the output must end in .svg or .html"));
    }
    const MemorySnapshot s = LoadOrFail("plot", options->file);
    WriteOrFail("plot", options->output, html ? RenderHtml(s, options->file) : RenderSvg(s, options->file));
    std::cout << "wrote " << options->output << " (" << s.segments.size() << " segments, " << s.history.size()
              << " history events)\n";
  });

  CLI::App* diff = snapshot->add_subcommand(
      "diff",
      "What changed between two snapshots: segments and blocks added/removed, bytes per pool and call site");
  diff->add_option("before", options->file, "The earlier snapshot")->required();
  diff->add_option("after", options->other, "The later snapshot")->required();
  diff->add_option("--top", options->top, "Length of each list")->capture_default_str();
  diff->callback([options] {
    const MemorySnapshot a = LoadOrFail("diff", options->file);
    const MemorySnapshot b = LoadOrFail("diff", options->other);
    std::cout << RenderDiffText(a, b, options->file, options->other, options->top);
  });

  CLI::App* check = AddFileCommand(
      snapshot, "check",
      "Check the snapshot's invariants and that its statistics agree with its blocks (exit 1 if not)",
      options);
  check->callback([options] {
    const MemorySnapshot s = LoadOrFail("check", options->file);
    if (absl::Status st = CheckStatsConsistency(s); !st.ok()) Fail("check", kExitFailed, st.message());
    std::cout << options->file << ": ok (" << s.segments.size() << " segments, " << s.history.size()
              << " history events)\n";
  });

  CLI::App* export_torch = AddFileCommand(
      snapshot, "export-torch",
      "Write PyTorch's memory snapshot pickle (opens in pytorch.org/memory_viz and torch.cuda._memory_viz)",
      options);
  export_torch->add_option("-o,--output", options->output, "OUT.pickle")->required();
  export_torch->callback([options] {
    const MemorySnapshot s = LoadOrFail("export-torch", options->file);
    WriteOrFail("export-torch", options->output, SnapshotToTorchPickle(s));
    std::cout << "wrote " << options->output << "\n";
  });

  CLI::App* import_torch = snapshot->add_subcommand(
      "import-torch", "Convert a snapshot written by torch.cuda.memory._dump_snapshot() to graphalloc JSON");
  import_torch->add_option("pickle", options->file, "IN.pickle")->required();
  import_torch->add_option("-o,--output", options->output, "OUT.json")->required();
  import_torch->add_option("--device", options->device, "Device to keep (default: the lowest with data)");
  import_torch->callback([options] {
    absl::StatusOr<std::string> bytes = ReadFileBytes(options->file);
    if (!bytes.ok()) Fail("import-torch", kExitBadInput, bytes.status().message());
    absl::StatusOr<MemorySnapshot> s = SnapshotFromTorchPickle(*bytes, options->file, options->device);
    if (!s.ok()) Fail("import-torch", kExitBadInput, s.status().message());
    WriteOrFail("import-torch", options->output, SnapshotToJson(*s));
    std::cout << "wrote " << options->output << " (" << s->segments.size() << " segments, "
              << s->history.size() << " history events)\n";
  });
}

}  // namespace graphalloc::tools
