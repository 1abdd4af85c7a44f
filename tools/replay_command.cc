// `graphalloc replay TRACE [--device auto|sim|cuda] [--config STR] [--capacity BYTES] [--find-min-capacity]
//                   [--json] [--snapshot OUT.json [--history-max N]]`
//
// Reads the trace (plain or gzip'd CSV), replays it through a fresh CachingAllocator on a fresh device and
// prints the trace, the device, the config, events, peak live and peak reserved bytes, their ratio, whether
// it completed and the time per allocator operation. --capacity makes the device that small (the simulated
// device's capacity, rounded up to its 2 MiB granularity; a memory limit on the real one).
// --find-min-capacity searches, in 2 MiB steps, for the smallest capacity at which the replay completes.
// The allocator's configuration is --config, else GRAPHALLOC_CONF, else the defaults.
// Exit codes (tools/cli_common.h): 0 completed, 1 not completed (out of memory) or no usable GPU, 2 bad input
// (a bad trace, flag or configuration, a snapshot that cannot be written).
#include "tools/replay_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "graphalloc/allocator/snapshot/snapshot_json.h"
#include "graphalloc/allocator/trace/trace_reader.h"
#include "graphalloc/allocator/trace/trace_replay.h"
#include "tools/cli_common.h"
#include "tools/snapshot/snapshot_views.h"

namespace graphalloc::tools {
namespace {

constexpr int kExitNotCompleted = kExitFailed;
constexpr std::size_t kCapacityStep = 2 * kMiB;  // the H100's (and the simulated device's) granularity
// History a --snapshot keeps unless told otherwise: every event of a 3M-event trace made 500 MB snapshots.
constexpr std::size_t kDefaultHistoryMax = 100000;

struct ReplayCliOptions {
  std::string trace;
  std::string device = "auto";
  std::string config;
  std::size_t capacity = 0;  // 0: the device as it is
  bool find_min_capacity = false;
  bool json = false;
  std::string snapshot;  // write snapshots at the peak (this path) and at the end (".end" inserted)
  std::size_t history_max = kDefaultHistoryMax;  // history events a snapshot keeps (the newest)
  bool allow_partial_history = false;            // replay a snapshot's partial history, saying so
};

// Where the snapshot taken at `label` goes: the path itself for the peak, "x.end.json" for the end.
std::string SnapshotPath(const std::string& path, absl::string_view label) {
  if (label == "peak") return path;
  const std::size_t dot = path.rfind('.');
  const std::size_t slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return absl::StrCat(path, ".", label);
  return absl::StrCat(path.substr(0, dot), ".", label, path.substr(dot));
}

// The device one replay runs on: `kind` is "sim" or "cuda"; `capacity` 0 means the device as it is.
struct DeviceSetup {
  std::string kind;
  std::size_t capacity = 0;
};

struct Probe {
  ReplayResult result;
  std::string device_name;
  std::size_t device_total = 0;
  std::optional<std::size_t> device_free;  // before the replay (the real device's own usage shows here)
  std::size_t effective_capacity = 0;      // what was applied (rounded on the simulated device); 0: none
};

// One replay on a fresh device and a fresh allocator.
absl::StatusOr<Probe> RunProbe(const Trace& trace, const DeviceSetup& setup, const Config& config,
                               const ReplayOptions& replay_options = {}) {
  Probe probe;
  std::shared_ptr<Driver> driver;
  if (setup.kind == "sim") {
    SimDriverOptions sim;
    if (setup.capacity != 0) sim.capacity = RoundUp(setup.capacity, sim.granularity);
    probe.effective_capacity = setup.capacity == 0 ? 0 : sim.capacity;
    absl::StatusOr<std::unique_ptr<SimDriver>> made = SimDriver::Create(sim);
    if (!made.ok()) return made.status();
    driver = std::move(*made);
  } else {
    absl::StatusOr<std::unique_ptr<CudaDriver>> made = CudaDriver::Create(0);
    if (!made.ok()) return made.status();
    driver = std::move(*made);
    probe.effective_capacity = setup.capacity;
  }
  probe.device_name = driver->Info().name;
  probe.device_total = driver->Info().total_memory;
  if (absl::StatusOr<MemoryInfo> memory = driver->GetMemoryInfo(); memory.ok())
    probe.device_free = memory->free;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver, config);
  if (!allocator.ok()) return allocator.status();
  if (setup.kind == "cuda" && setup.capacity != 0) (*allocator)->SetMemoryLimit(setup.capacity);
  absl::StatusOr<ReplayResult> result = ReplayTrace(trace, **allocator, replay_options);
  if (!result.ok()) return result.status();
  probe.result = std::move(*result);
  return probe;
}

struct MinCapacity {
  std::size_t bytes = 0;
  double ratio = 0.0;
  int probes = 0;
  double seconds = 0.0;
};

// Binary search in 2 MiB steps between peak live (rounded up) and the unlimited run's peak reserved, which
// is known to complete. Each probe is a fresh device and allocator.
absl::StatusOr<MinCapacity> FindMinCapacity(const Trace& trace, const std::string& kind, const Config& config,
                                            const ReplayResult& unlimited) {
  const auto start = std::chrono::steady_clock::now();
  MinCapacity min;
  std::size_t hi = RoundUp(unlimited.peak_reserved_bytes, kCapacityStep);
  std::size_t lo =
      std::min(hi, RoundUp(std::max<std::uint64_t>(unlimited.peak_live_bytes, 1), kCapacityStep));
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / kCapacityStep / 2 * kCapacityStep;
    absl::StatusOr<Probe> probe = RunProbe(trace, DeviceSetup{kind, mid}, config);
    ++min.probes;
    if (!probe.ok()) return probe.status();
    if (probe->result.completed) {
      hi = mid;
    } else {
      lo = mid + kCapacityStep;
    }
  }
  min.bytes = hi;
  min.ratio = unlimited.peak_live_bytes == 0
                  ? 0.0
                  : static_cast<double>(hi) / static_cast<double>(unlimited.peak_live_bytes);
  min.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return min;
}

// Picks "sim" or "cuda"; `no_gpu` says why the GPU was not used with --device auto.
absl::StatusOr<std::string> ChooseDevice(const std::string& requested, std::string* no_gpu) {
  if (requested == "sim") return std::string("sim");
  absl::StatusOr<std::unique_ptr<CudaDriver>> cuda = CudaDriver::Create(0);
  if (cuda.ok()) return std::string("cuda");
  if (requested == "cuda") {
    return absl::UnavailableError(absl::StrCat("no usable GPU: ", cuda.status().message()));
  }
  *no_gpu = std::string(cuda.status().message());
  return std::string("sim");
}

void PrintText(const ReplayCliOptions& options, const Trace& trace, const std::string& kind,
               const std::string& no_gpu, const Config& config, const Probe& run,
               const std::optional<MinCapacity>& min) {
  const ReplayResult& r = run.result;
  std::cout << "Trace:         " << trace.name << " (" << options.trace << ")\n";
  if (!trace.partial.empty()) {
    std::cout << "Partial:       " << trace.partial << "; the figures below are of the part replayed\n";
  }
  std::cout << "Device:        " << run.device_name << " (" << kind << "), " << FormatBytes(run.device_total)
            << " total";
  if (kind == "cuda" && run.device_free.has_value())
    std::cout << ", " << FormatBytes(*run.device_free) << " free";
  std::cout << "\n";
  if (!no_gpu.empty()) std::cout << "No GPU used:   " << no_gpu << "\n";
  if (run.effective_capacity != 0) {
    std::cout << "Capacity:      " << FormatBytesExact(run.effective_capacity);
    if (kind == "cuda" && run.device_free.has_value() && *run.device_free < run.effective_capacity) {
      std::cout << "; note: only " << FormatBytes(*run.device_free) << " of the device is free";
    }
    std::cout << "\n";
  }
  std::cout << "Config:        " << DescribeConfig(config, options.config) << "\n";
  std::cout << "Events:        " << r.events << " of " << trace.events.size() << " (" << r.allocs
            << " allocs, " << r.frees << " frees)\n";
  std::cout << "Peak live:     " << FormatBytesExact(r.peak_live_bytes);
  if (!r.completed)
    std::cout << " up to the stop; the whole trace's: " << FormatBytes(r.trace_peak_live_bytes);
  std::cout << "\n";
  std::cout << "Peak reserved: " << FormatBytesExact(r.peak_reserved_bytes) << "\n";
  std::cout << "Ratio:         " << absl::StrFormat("%.3f", r.ratio) << "\n";
  if (r.completed) {
    std::cout << (trace.partial.empty() ? "Completed:     yes\n"
                                        : "Completed:     yes, of a partial history (not the whole run)\n");
  } else {
    // The out-of-memory error explains itself over several lines (allocator/snapshot/oom_report.h).
    std::cout << "Completed:     no: at " << r.failure->where << " (event " << r.failure->event_index
              << "): " << absl::StripTrailingAsciiWhitespace(r.failure->message) << "\n";
  }
  std::cout << "Time per op:   " << absl::StrFormat("%.1f ns", r.ns_per_op)
            << absl::StrFormat(" (replay loop %.3f s)", r.wall_seconds) << "\n";
  if (min.has_value()) {
    std::cout << "Min capacity:  " << FormatBytes(min->bytes) << " = " << absl::StrFormat("%.3f", min->ratio)
              << " x peak live (" << min->probes << " probes, " << absl::StrFormat("%.1f s", min->seconds)
              << ")\n";
  }
}

void PrintJson(const ReplayCliOptions& options, const Trace& trace, const std::string& kind,
               const std::string& no_gpu, const Config& config, const Probe& run,
               const std::optional<MinCapacity>& min) {
  const ReplayResult& r = run.result;
  nlohmann::json out = {
      {"trace", trace.name},
      {"trace_path", options.trace},
      {"device", kind},
      {"device_name", run.device_name},
      {"device_total_bytes", run.device_total},
      {"config", config.ToString()},
      {"capacity_bytes",
       run.effective_capacity == 0 ? nlohmann::json(nullptr) : nlohmann::json(run.effective_capacity)},
      {"trace_events", trace.events.size()},
      {"events", r.events},
      {"allocs", r.allocs},
      {"frees", r.frees},
      {"peak_live_bytes", r.peak_live_bytes},
      {"trace_peak_live_bytes", r.trace_peak_live_bytes},
      {"peak_reserved_bytes", r.peak_reserved_bytes},
      {"ratio", r.ratio},
      {"completed", r.completed},
      {"partial_history", trace.partial.empty() ? nlohmann::json(nullptr) : nlohmann::json(trace.partial)},
      {"wall_seconds", r.wall_seconds},
      {"ns_per_op", r.ns_per_op},
  };
  if (run.device_free.has_value() && kind == "cuda") out["device_free_bytes"] = *run.device_free;
  if (!no_gpu.empty()) out["no_gpu_reason"] = no_gpu;
  if (r.failure.has_value()) {
    out["error"] = {{"event_index", r.failure->event_index},
                    {"where", r.failure->where},
                    {"message", r.failure->message}};
  }
  if (min.has_value()) {
    out["min_capacity"] = {
        {"bytes", min->bytes}, {"ratio", min->ratio}, {"probes", min->probes}, {"seconds", min->seconds}};
  }
  std::cout << out.dump(2) << "\n";
}

// Runs the command and prints its result or what went wrong; returns the exit code.
int RunReplay(const ReplayCliOptions& options) {
  auto fail = [](int code, absl::string_view message) {
    std::cerr << "graphalloc replay: " << message << "\n";
    return code;
  };
  absl::StatusOr<Config> config = ResolveConfig(options.config);
  if (!config.ok()) return fail(kExitBadInput, config.status().message());
  if (options.snapshot == "-") {
    return fail(
        kExitBadInput,
        "--snapshot -: a replay writes two snapshots (at the peak and at the end, or at an out of memory "
        "stop), which cannot share stdout; give a file name");
  }
  absl::StatusOr<Trace> trace = [&]() -> absl::StatusOr<Trace> {
    Progress progress("graphalloc replay: reading the trace");
    const TraceReadOptions read{.allow_partial_history = options.allow_partial_history};
    if (options.trace == "-") {  // stdin, as everywhere a file is read
      absl::StatusOr<std::string> bytes = ReadInput("-");
      if (!bytes.ok()) return bytes.status();
      return TraceFromBytes(*std::move(bytes), "(stdin)", read);
    }
    return ReadTrace(options.trace, read);
  }();
  if (!trace.ok()) return fail(kExitBadInput, trace.status().message());
  std::string no_gpu;
  absl::StatusOr<std::string> kind = ChooseDevice(options.device, &no_gpu);
  if (!kind.ok()) return fail(kExitNotCompleted, kind.status().message());

  // With --snapshot the run records its history (the newest --history-max events, unless the configuration
  // records history itself) and writes the allocator's state at the peak and at the end.
  ReplayOptions replay_options;
  std::vector<std::string> written;
  absl::Status snapshot_error;
  Config run_config = *config;
  if (!options.snapshot.empty()) {
    if (!run_config.record_history) {
      run_config.record_history = true;
      run_config.history_max_entries = options.history_max;
    }
    replay_options.snapshot_hook = [&](absl::string_view label, CachingAllocator& allocator) {
      const std::string path = SnapshotPath(options.snapshot, label);
      absl::Status s = WriteSnapshotFile(allocator.TakeSnapshot(label), path);
      if (s.ok()) {
        written.push_back(path);
      } else if (snapshot_error.ok()) {
        snapshot_error = s;
      }
    };
  }
  absl::StatusOr<Probe> run = [&] {
    Progress progress(absl::StrCat("graphalloc replay: replaying ", trace->events.size(), " events"));
    return RunProbe(*trace, DeviceSetup{*kind, options.capacity}, run_config, replay_options);
  }();
  if (!run.ok()) {
    return fail(absl::IsInvalidArgument(run.status()) ? kExitBadInput : kExitNotCompleted,
                run.status().message());
  }
  if (!snapshot_error.ok())
    return fail(kExitCannotWrite, absl::StrCat("--snapshot: ", snapshot_error.message()));
  std::optional<MinCapacity> min;
  if (options.find_min_capacity && run->result.completed) {
    Progress progress("graphalloc replay: searching for the smallest capacity");
    absl::StatusOr<MinCapacity> found = FindMinCapacity(*trace, *kind, *config, run->result);
    if (!found.ok())
      return fail(kExitNotCompleted, absl::StrCat("--find-min-capacity: ", found.status().message()));
    min = *found;
  }
  if (options.json) {
    PrintJson(options, *trace, *kind, no_gpu, *config, *run, min);
  } else {
    PrintText(options, *trace, *kind, no_gpu, *config, *run, min);
  }
  for (const std::string& path : written) std::cerr << "graphalloc replay: wrote snapshot " << path << "\n";
  return run->result.completed ? 0 : kExitNotCompleted;
}

// CLI11's check and conversion of a --capacity value: ParseByteSize's byte count, or its error.
CLI::Validator ByteSize() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        absl::StatusOr<std::size_t> bytes = ParseByteSize(value);
        if (!bytes.ok()) return std::string(bytes.status().message());
        value = absl::StrCat(*bytes);
        return "";
      },
      "");
}

}  // namespace

absl::StatusOr<std::size_t> ParseByteSize(absl::string_view text) {
  const absl::string_view original = text;
  text = absl::StripAsciiWhitespace(text);
  std::size_t split = 0;
  while (split < text.size() && (absl::ascii_isdigit(text[split]) || text[split] == '.')) ++split;
  const absl::string_view number = text.substr(0, split);
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(split)));
  struct Unit {
    const char* name;
    double multiplier;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
      {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
      {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12},
  };
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) found = &u;
  }
  double value = 0;
  const bool integral = number.find('.') == absl::string_view::npos;
  if (found == nullptr || number.empty() || !absl::SimpleAtod(number, &value) ||
      (found->multiplier == 1 && !integral)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", original,
        "' is not a size; give bytes (\"8589934592\") or a number with a unit (\"7.5GiB\", \"300MiB\", "
        "\"512KiB\", \"2GB\")"));
  }
  const double bytes = std::ceil(value * found->multiplier);
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", original, "' is not a usable capacity (must be > 0)"));
  }
  if (bytes > 0x1p63) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", original, "' is out of range (at most 8 EiB, 9223372036854775808 bytes)"));
  }
  std::uint64_t exact = 0;
  if (integral && found->multiplier == 1) {
    if (!absl::SimpleAtoi(number, &exact)) {
      return absl::InvalidArgumentError(absl::StrCat("'", original, "' is not a byte count"));
    }
    return static_cast<std::size_t>(exact);  // plain bytes: exact, no floating-point rounding
  }
  return static_cast<std::size_t>(bytes);
}

void AddReplayCommand(CLI::App& app) {
  auto options = std::make_shared<ReplayCliOptions>();
  CLI::App* command = app.add_subcommand(
      "replay",
      "Replay an allocation trace (PyTorch CSV, plain or gzip'd) and report peak reserved / peak live");
  command
      ->add_option(
          "trace", options->trace,
          "The trace file (action,addr,size,stream,time_us; plain or gzip'd), or a snapshot with its "
          "history; - for stdin")
      ->required();
  command
      ->add_option("--device", options->device, "auto (the GPU if there is one, else simulated), sim or cuda")
      ->check(CLI::IsMember({"auto", "sim", "cuda"}))
      ->capture_default_str();
  command->add_option("--config", options->config,
                      "Allocator configuration, GRAPHALLOC_CONF syntax (\"max_split_size_mb:256,...\"); "
                      "overrides GRAPHALLOC_CONF, which applies otherwise");
  CLI::Option* capacity =
      command
          ->add_option(
              "--capacity", options->capacity,
              "Device capacity: bytes or a size with a unit (7.5GiB, 300MiB); rounded up to 2 MiB on "
              "the simulated device, a memory limit on the real one")
          ->transform(ByteSize())
          ->type_name("SIZE");
  command
      ->add_flag("--find-min-capacity", options->find_min_capacity,
                 "Also search (2 MiB steps) for the smallest capacity at which the replay completes")
      ->excludes(capacity);
  command->add_flag("--json", options->json, "Print the result as one JSON object");
  command->add_option("--snapshot", options->snapshot,
                      "Write the allocator's state (with its history) at the trace's peak to this JSON file, "
                      "and at the end to the same name with .end inserted (x.json, x.end.json)");
  command
      ->add_option(
          "--history-max", options->history_max,
          "With --snapshot: keep the newest N history events; older ones are dropped and the snapshot "
          "says so (keeping every event of a 3M-event trace made snapshots of 530 MB)")
      ->check(CLI::Range(std::size_t{1}, kMaxHistoryEntries))
      ->capture_default_str();
  command->add_flag(
      "--allow-partial-history", options->allow_partial_history,
      "Replay a snapshot whose history is not the whole run (it overflowed, or began after blocks "
      "were allocated), saying so; refused otherwise");
  command->callback([options] {
    if (int code = RunReplay(*options); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace graphalloc::tools
