#include "bench/trace_replay_support.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "graphalloc/allocator/core/config.h"
#include "graphalloc/allocator/trace/trace_replay.h"

#ifndef GRAPHALLOC_BENCH_TRACE_DIR
#define GRAPHALLOC_BENCH_TRACE_DIR "traces"
#endif

namespace graphalloc::bench {
namespace {

constexpr absl::string_view kTraceSuffix = ".csv.gz";

std::string ProgramName(absl::string_view file_name) {
  for (absl::string_view suffix : {kTraceSuffix, absl::string_view(".csv"), absl::string_view(".json")}) {
    if (absl::EndsWith(file_name, suffix))
      return std::string(file_name.substr(0, file_name.size() - suffix.size()));
  }
  return std::string(file_name);
}

}  // namespace

absl::StatusOr<ReplayProgram> CompileReplay(const Trace& trace) {
  // The library's own validation: every free matches a live allocation, no address allocated twice.
  absl::StatusOr<TraceSummary> summary = SummarizeTrace(trace);
  if (!summary.ok()) return summary.status();
  ReplayProgram program;
  program.name = ProgramName(trace.name);
  program.peak_live_bytes = summary->peak_live_bytes;
  program.ops.reserve(summary->allocs + summary->frees);
  absl::flat_hash_map<std::uint64_t, std::uint32_t> slot_of;  // live trace address -> slot
  absl::flat_hash_map<std::uint64_t, std::uint16_t> stream_index;
  std::vector<std::uint32_t> free_slots;  // reused last-freed first, so the live table stays small
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    if (e.action == TraceAction::kAlloc) {
      if (e.size == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(trace.Where(i), ": an allocation of 0 bytes, which no allocator hands a block for"));
      }
      auto [it, inserted] =
          stream_index.try_emplace(e.stream, static_cast<std::uint16_t>(program.streams.size()));
      if (inserted) {
        if (program.streams.size() > std::numeric_limits<std::uint16_t>::max()) {
          return absl::InvalidArgumentError(absl::StrCat(trace.Where(i), ": more than 65,536 streams"));
        }
        program.streams.push_back(e.stream);
      }
      std::uint32_t slot;
      if (free_slots.empty()) {
        slot = static_cast<std::uint32_t>(program.slots++);
      } else {
        slot = free_slots.back();
        free_slots.pop_back();
      }
      slot_of.emplace(e.addr, slot);
      program.ops.push_back({e.size, slot, it->second, true});
      ++program.allocs;
    } else if (e.action == TraceAction::kFreeCompleted) {
      auto it = slot_of.find(e.addr);  // SummarizeTrace() proved it is there
      program.ops.push_back({0, it->second, 0, false});
      free_slots.push_back(it->second);
      slot_of.erase(it);
      ++program.frees;
    }
  }
  return program;
}

absl::StatusOr<std::vector<ReplayProgram>> LoadShippedTraces() {
  const char* env = std::getenv("GRAPHALLOC_TRACE_DIR");
  const std::filesystem::path dir = env != nullptr && env[0] != '\0' ? env : GRAPHALLOC_BENCH_TRACE_DIR;
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && absl::EndsWith(it->path().filename().string(), kTraceSuffix)) {
      paths.push_back(it->path());
    }
  }
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("trace directory ", dir.string(), ": ", ec.message(),
                     " (set GRAPHALLOC_TRACE_DIR to the folder of the *.csv.gz traces)"));
  }
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat("no *.csv.gz trace in ", dir.string(),
                                            " (set GRAPHALLOC_TRACE_DIR to the folder of the traces)"));
  }
  std::sort(paths.begin(), paths.end());
  std::vector<ReplayProgram> programs;
  for (const std::filesystem::path& path : paths) {
    absl::StatusOr<Trace> trace = ReadTrace(path.string());
    if (!trace.ok()) return trace.status();
    absl::StatusOr<ReplayProgram> program = CompileReplay(*trace);
    if (!program.ok()) return program.status();
    programs.push_back(std::move(*program));
  }
  return programs;
}

TraceStreams::~TraceStreams() {
  for (const auto& [id, stream] : streams_) (void)driver_->StreamDestroy(stream);
}

absl::StatusOr<std::vector<Stream>> TraceStreams::For(const ReplayProgram& program) {
  std::vector<Stream> out;
  for (std::uint64_t id : program.streams) {
    if (id == 0) {
      out.push_back(kDefaultStream);
      continue;
    }
    auto it = streams_.find(id);
    if (it == streams_.end()) {
      absl::StatusOr<Stream> stream = driver_->StreamCreate();
      if (!stream.ok()) return stream.status();
      it = streams_.emplace(id, *stream).first;
    }
    out.push_back(it->second);
  }
  return out;
}

std::string ReplayName(ReplayMode mode, const std::string& impl, const std::string& trace) {
  const char* prefix = mode == ReplayMode::kCold      ? "replay/"
                       : mode == ReplayMode::kSettled ? "replay_settled/"
                                                      : "replay_warm/";
  return absl::StrCat(prefix, impl, "/", trace);
}

std::chrono::milliseconds SettlePause(std::uint64_t peak_live_bytes) {
  const double gib = static_cast<double>(peak_live_bytes) / static_cast<double>(std::uint64_t{1} << 30);
  return kSettleBase + std::chrono::milliseconds(static_cast<std::int64_t>(gib * kSettlePerGiB.count()));
}

absl::Status GraphallocReplayTarget::Prepare(const ReplayProgram& program) {
  allocator_.reset();
  if (timed_ != nullptr) timed_->Reset();
  absl::StatusOr<Config> config = Config::FromEnvironment();
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<CachingAllocator>> allocator = CachingAllocator::Create(driver_, *config);
  if (!allocator.ok()) return allocator.status();
  absl::StatusOr<std::vector<Stream>> streams = streams_->For(program);
  if (!streams.ok()) return streams.status();
  allocator_ = std::move(*allocator);
  stream_of_ = std::move(*streams);
  peak_live_bytes_ = program.peak_live_bytes;
  error_.clear();
  return absl::OkStatus();
}

void GraphallocReplayTarget::Finish(benchmark::State& state) {
  if (allocator_ == nullptr) return;
  const auto peak = static_cast<double>(allocator_->GetStats().reserved_bytes.all().peak);
  state.counters["peak_reserved_bytes"] = peak;
  if (peak_live_bytes_ != 0) state.counters["ratio"] = peak / static_cast<double>(peak_live_bytes_);
  if (timed_ != nullptr && state.iterations() > 0) {
    // Per timed replay: how many calls of each kind, and their wall time.
    const double n = static_cast<double>(state.iterations());
    for (int k = 0; k < kDriverCallKinds; ++k) {
      const CallTotals& t = timed_->Totals(TimedDriver::Phase::kTimed, static_cast<DriverCall>(k));
      if (t.calls == 0) continue;
      const std::string name = DriverCallName(static_cast<DriverCall>(k));
      state.counters[name + "_n"] = static_cast<double>(t.calls) / n;
      state.counters[name + "_us"] = static_cast<double>(t.wall_ns) / 1e3 / n;
    }
    state.counters["driver_us"] =
        static_cast<double>(timed_->Sum(TimedDriver::Phase::kTimed).wall_ns) / 1e3 / n;
  }
  allocator_.reset();  // gives every segment back
}

}  // namespace graphalloc::bench
