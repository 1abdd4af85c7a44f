// Replaying the shipped allocation traces (traces/*.csv.gz) as a benchmark, through any allocator: shared by
// replay_bench (graphalloc on the simulated device and the GPU) and peers_c10 (PyTorch's c10 allocator
// beside graphalloc on the GPU, in one process).
//
// Benchmarks: "replay/<impl>/<trace>", "replay_settled/<impl>/<trace>" (real devices only) and
// "replay_warm/<impl>/<trace>", one iteration = one replay of the whole trace; time per replay (ms),
// counters per replay:
//   ops             allocate + free calls made (the trace's alloc and free_completed rows)
//   allocs, frees   the two kinds
//   ns_per_op       the timed replay's wall time divided by ops
//   streams         distinct streams the trace uses
//   peak_live_bytes the trace's own peak of live bytes
// graphalloc adds peak_reserved_bytes and its ratio to peak_live_bytes, and, where its target was made with
// `split` (replay_bench), the driver calls of each timed replay by kind (bench/timed_driver.h): create_n,
// map_n, access_n, unmap_n, release_n, ... with their wall time (<call>_us) and their sum (driver_us):
// which call a replay from an empty allocator spends its time in.
//
// What is timed: only the allocate and free calls, in the trace's order, from a precompiled list of
// operations (CompileReplay: the trace is read once with the library's ReadTrace and validated with its
// SummarizeTrace, outside any timing; each block gets a slot in a small pointer table, so the timed loop
// does no hashing). The memory is never touched (no kernels, no memsets): this measures the allocator.
//
// Iterations, and why:
//   replay/       every iteration starts from an empty allocator: the untimed teardown frees what the
//                 trace left live and empties the cache (graphalloc EmptyCache, c10 emptyCache). Each
//                 iteration is then the same replay from the same state, as the recorded program ran
//                 from a fresh process, device-memory calls (cuMemCreate & co., cudaMalloc) included.
//                 Without the EmptyCache every iteration after the first would be all cache hits and
//                 the first would count for almost nothing, so iterations would not be comparable.
//                 The replay starts right after the release, as a wake of a discarded pool would.
//   replay_settled/  the same, but the untimed teardown then waits for the device to settle (kSettleBase
//                 plus kSettlePerGiB per GiB of the trace's peak live bytes) before the next replay: the
//                 driver clears physical memory released with cuMemRelease in the background, and memory
//                 created meanwhile waits for it (docs/benchmarks.md: cuMemCreate of a 512 MiB handle
//                 took ~1 ms right after a release against ~0.17 ms once settled; copies ran ~2.5 ms per
//                 GiB released slower, normal again 300 ms after a 1 GiB release). A process starting, or
//                 a first training step, finds the device settled. A fixed kSettledIterations per
//                 repetition keeps the waits bounded. Registered on real devices only (the simulated
//                 device clears nothing).
//   replay_warm/  one untimed replay first, then iterations that start with the cache as the previous
//                 replay left it (what the trace left live is freed, untimed): the steady state of a
//                 training or serving loop, where the allocator rarely asks the device for memory.
//
// Streams: trace stream 0 is the default (legacy null) stream, as in the recording and in graphalloc's
// ReplayTrace; any other id gets a stream created once, through the device's driver (TraceStreams), and
// shared by every implementation on that device (c10 receives the same CUstream as a cudaStream_t). The
// shipped traces use stream 0 only.
#ifndef GRAPHALLOC_BENCH_TRACE_REPLAY_SUPPORT_H_
#define GRAPHALLOC_BENCH_TRACE_REPLAY_SUPPORT_H_

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/timed_driver.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/allocator/trace/trace_reader.h"

namespace graphalloc::bench {

struct ReplayOp {
  std::uint64_t size = 0;    // bytes to allocate (allocations only)
  std::uint32_t slot = 0;    // the block's entry in the pointer table
  std::uint16_t stream = 0;  // index into ReplayProgram::streams (allocations only)
  bool alloc = false;        // allocate, else free
};

// A trace compiled for replay: the operations alone, in order.
struct ReplayProgram {
  std::string name;  // the file's name without ".csv.gz" ("gpt2_train")
  std::vector<ReplayOp> ops;
  std::size_t slots = 0;               // the most blocks live at once: the pointer table's size
  std::vector<std::uint64_t> streams;  // trace stream ids, in order of first use
  std::size_t allocs = 0;
  std::size_t frees = 0;
  std::uint64_t peak_live_bytes = 0;
};

// InvalidArgument (from SummarizeTrace) for a bad trace; also for one with more than 65,536 streams or an
// allocation of zero bytes (no allocator hands out a block for it).
absl::StatusOr<ReplayProgram> CompileReplay(const Trace& trace);

// Every *.csv.gz of $GRAPHALLOC_TRACE_DIR, else of the source tree's traces/ (the path is compiled in),
// read and compiled, by name. An error names the directory or the file.
absl::StatusOr<std::vector<ReplayProgram>> LoadShippedTraces();

// Trace stream ids to streams of one device, created on first use and destroyed with this object (see the
// top comment).
class TraceStreams {
 public:
  explicit TraceStreams(std::shared_ptr<Driver> driver) : driver_(std::move(driver)) {}
  ~TraceStreams();
  TraceStreams(const TraceStreams&) = delete;
  TraceStreams& operator=(const TraceStreams&) = delete;
  // One stream per entry of program.streams.
  absl::StatusOr<std::vector<Stream>> For(const ReplayProgram& program);

 private:
  std::shared_ptr<Driver> driver_;
  absl::flat_hash_map<std::uint64_t, Stream> streams_;
};

enum class ReplayMode { kCold, kSettled, kWarm };

// replay_settled/ (see the top comment): the pause after each untimed teardown, and the iterations per
// repetition. 300 ms after a 1 GiB release copies ran at full speed again; the per-GiB part scales that
// with the memory the teardown released, with margin (gpt2_train, 7.2 GiB: 460 ms a pause).
inline constexpr std::chrono::milliseconds kSettleBase{100};
inline constexpr std::chrono::milliseconds kSettlePerGiB{50};
inline constexpr int kSettledIterations = 3;
std::chrono::milliseconds SettlePause(std::uint64_t peak_live_bytes);

std::string ReplayName(ReplayMode mode, const std::string& impl, const std::string& trace);

// The timed loop: the program's operations through `target` (see BM_Replay), with live pointers in
// `slots` (freed ones zeroed). Returns how many operations completed: ops.size() unless one failed.
template <class Target>
std::size_t RunReplay(const ReplayProgram& program, std::uintptr_t* slots, Target& target) {
  const ReplayOp* ops = program.ops.data();
  const std::size_t n = program.ops.size();
  for (std::size_t i = 0; i < n; ++i) {
    const ReplayOp& op = ops[i];
    if (op.alloc) {
      const std::uintptr_t p = target.Alloc(op.size, op.stream);
      if (p == 0) [[unlikely]]
        return i;
      slots[op.slot] = p;
    } else {
      if (!target.Free(slots[op.slot])) [[unlikely]]
        return i;
      slots[op.slot] = 0;
    }
  }
  return n;
}

// One replay benchmark. `Target` is an allocator under test:
//   absl::Status Prepare(const ReplayProgram&)     untimed: start from an empty allocator, resolve streams
//   std::uintptr_t Alloc(std::size_t, std::uint16_t stream index)   0 on failure
//   bool Free(std::uintptr_t)                      false on failure
//   std::string Error()                            what the last failure was
//   absl::Status EmptyCache()
//   void Finish(benchmark::State&)                 untimed: its own counters; give every byte back
// and optionally
//   void SetTimed(bool)                            the timed replay begins (true) or ends (false)
template <class Target>
void BM_Replay(benchmark::State& state, Target* target, const ReplayProgram* program, ReplayMode mode) {
  std::vector<std::uintptr_t> slots(program->slots, 0);
  std::string error;
  auto free_left = [&]() {
    for (std::uintptr_t& p : slots) {
      if (p == 0) continue;
      if (!target->Free(p) && error.empty()) error = "freeing a block left live: " + target->Error();
      p = 0;
    }
  };
  auto replay = [&](const char* what) {
    const std::size_t done = RunReplay(*program, slots.data(), *target);
    if (done == program->ops.size()) return true;
    const ReplayOp& op = program->ops[done];
    error = std::string(what) + " of " + program->name + " failed at operation " + std::to_string(done) +
            (op.alloc ? " (allocate " + std::to_string(op.size) + " bytes): " : " (free): ") +
            target->Error();
    return false;
  };
  if (absl::Status s = target->Prepare(*program); !s.ok()) {
    state.SkipWithError(("replay setup failed: " + s.ToString()).c_str());
    return;
  }
  auto set_timed = [target](bool timed) {
    if constexpr (requires { target->SetTimed(true); }) target->SetTimed(timed);
  };
  const bool empty_each = mode != ReplayMode::kWarm;
  if (mode == ReplayMode::kWarm && replay("warm-up replay")) free_left();
  if (mode == ReplayMode::kSettled) std::this_thread::sleep_for(SettlePause(program->peak_live_bytes));
  std::int64_t timed_ns = 0;
  if (error.empty()) {
    for (auto _ : state) {
      set_timed(true);
      const auto t0 = std::chrono::steady_clock::now();
      const bool ok = replay("replay");
      timed_ns +=
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      set_timed(false);
      if (!ok) break;
      state.PauseTiming();
      free_left();
      if (empty_each && error.empty()) {
        if (absl::Status s = target->EmptyCache(); !s.ok()) error = "EmptyCache failed: " + s.ToString();
      }
      if (mode == ReplayMode::kSettled) std::this_thread::sleep_for(SettlePause(program->peak_live_bytes));
      state.ResumeTiming();
      if (!error.empty()) break;
    }
  }
  free_left();
  if (!error.empty()) state.SkipWithError(error.c_str());
  const double ops = static_cast<double>(program->ops.size());
  state.counters["ops"] = ops;
  state.counters["allocs"] = static_cast<double>(program->allocs);
  state.counters["frees"] = static_cast<double>(program->frees);
  state.counters["streams"] = static_cast<double>(program->streams.size());
  state.counters["peak_live_bytes"] = static_cast<double>(program->peak_live_bytes);
  if (state.iterations() > 0 && ops > 0) {
    state.counters["ns_per_op"] =
        static_cast<double>(timed_ns) / (static_cast<double>(state.iterations()) * ops);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(program->ops.size()));
  target->Finish(state);
}

// Registers replay/, replay_settled/ (when `real_device`) and replay_warm/ of every program for one
// implementation; `target` and `programs` must outlive the benchmark run.
template <class Target>
void RegisterReplays(const std::string& impl, Target* target, const std::vector<ReplayProgram>& programs,
                     bool real_device) {
  for (ReplayMode mode : {ReplayMode::kCold, ReplayMode::kSettled, ReplayMode::kWarm}) {
    if (mode == ReplayMode::kSettled && !real_device) continue;
    for (const ReplayProgram& program : programs) {
      auto* b = benchmark::RegisterBenchmark(ReplayName(mode, impl, program.name).c_str(), BM_Replay<Target>,
                                             target, &program, mode);
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (mode == ReplayMode::kSettled) b->Iterations(kSettledIterations);
    }
  }
}

// graphalloc as a replay target: a fresh CachingAllocator per benchmark (Config::FromEnvironment, i.e.
// GRAPHALLOC_CONF or the defaults), on `driver`, with streams from `streams`. With `split`, the allocator's
// driver calls go through a TimedDriver and each timed replay's calls are reported by kind (top comment):
// a few clock reads per driver call, under 1% of a replay from an empty allocator, nothing on a cache hit.
class GraphallocReplayTarget {
 public:
  GraphallocReplayTarget(std::shared_ptr<Driver> driver, TraceStreams* streams, bool split = false)
      : driver_(split ? std::make_shared<TimedDriver>(driver) : driver), streams_(streams) {
    if (split) timed_ = static_cast<TimedDriver*>(driver_.get());
  }

  absl::Status Prepare(const ReplayProgram& program);
  std::uintptr_t Alloc(std::size_t size, std::uint16_t stream) {
    absl::StatusOr<DevicePtr> p = allocator_->Allocate(size, stream_of_[stream]);
    if (!p.ok()) [[unlikely]] {
      error_ = p.status().ToString();
      return 0;
    }
    return *p;
  }
  bool Free(std::uintptr_t ptr) {
    absl::Status s = allocator_->Free(ptr);
    if (!s.ok()) [[unlikely]] {
      error_ = s.ToString();
      return false;
    }
    return true;
  }
  std::string Error() const { return error_; }
  absl::Status EmptyCache() { return allocator_->EmptyCache(); }
  void SetTimed(bool timed) {
    if (timed_ != nullptr) timed_->SetPhase(timed ? TimedDriver::Phase::kTimed : TimedDriver::Phase::kNone);
  }
  void Finish(benchmark::State& state);

 private:
  std::shared_ptr<Driver> driver_;
  TimedDriver* timed_ = nullptr;  // driver_, when split
  TraceStreams* streams_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<Stream> stream_of_;
  std::uint64_t peak_live_bytes_ = 0;
  std::string error_;
};

}  // namespace graphalloc::bench

#endif  // GRAPHALLOC_BENCH_TRACE_REPLAY_SUPPORT_H_
