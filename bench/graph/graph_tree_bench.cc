// Graph tree benchmarks (Google Benchmark; --benchmark_format=json or --benchmark_out=FILE for JSON), on
// the simulated device and, when there is one, the GPU. The workload is a function of 100 tiny kernels
// (a scale, then 99 adds) over 16 static inputs of 256 floats, returning one output:
//   graph_tree/replay_host/<dev>/kernels:N   host time of GraphTree::Call replaying it (outputs dropped
//   inside) graph_tree/raw_launch_host/<dev>   host time of one GraphLaunch of the same captured graph
//   graph_tree/eager_host/<dev>        host time of running the function eagerly (100 launches, alloc, free)
//   graph_tree/{replay,raw_launch,eager}_wall/<dev>   the same, synchronized every call (real time)
//   graph_tree/rerecord_{update,instantiate}/<dev>   a call whose static input moved: capture, checkpoint,
//                                      then an in-place executable update (the default) or a new
//                                      instantiation (update_executables_first off)
//   graph_tree/driver_{update,instantiate}/<dev>     the driver calls alone: GraphExecUpdate vs
//                                      GraphInstantiate + GraphExecDestroy of the 100-node graph
//   graph_tree/capture/<dev>           the capture of the workload into a pool alone, which every
//                                      re-record pays in both modes: a re-record's update-vs-instantiate
//                                      speedup is (capture + update) / (capture + instantiate + the new
//                                      executable's first launch), so it shrinks as the capture grows
// Host-time benchmarks use manual timing around the measured call and synchronize every 32 calls outside
// it, so the launch queue never fills. The tree's added host time per call is replay_host - raw_launch_host
// (the target is under 1 us with 16 inputs); the speedup is eager_wall / replay_wall.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_support.h"
#include "examples/kernels/tiny_kernels.h"
#include "graphalloc/graph/graph_tree.h"

namespace graphalloc::bench {
namespace {

using Clock = std::chrono::steady_clock;
using testing::AddF32;
using testing::ScaleF32;

constexpr int kKernels = 100;  // the workload; the replay/launch/eager benchmarks also run with 1 (range(0))
constexpr int kInputs = 16;
constexpr std::size_t kElems = 256;
constexpr std::size_t kBufBytes = kElems * sizeof(float);
constexpr int kSyncEvery = 32;
constexpr int kRerecords = 200;  // iterations of the re-record benchmarks: one new recording each

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The 16 input buffers, the spare addresses the re-record benchmarks move input 1 to, and the function.
class Workload {
 public:
  explicit Workload(BenchDevice& dev, int kernels = kKernels) : dev_(dev), kernels_(kernels) {
    for (int i = 0; i < kInputs + kRerecords; ++i) {
      absl::StatusOr<DevicePtr> p = dev.allocator->Allocate(kBufBytes, dev.stream);
      if (!p.ok()) {
        error_ = p.status().ToString();
        return;
      }
      buffers_.push_back(*p);
      if (absl::Status s = testing::FillF32(*dev.driver, dev.stream, *p, kElems, 1.0f + i); !s.ok()) {
        error_ = s.ToString();
      }
    }
    if (absl::Status s = testing::PreloadTinyKernels(*dev.driver); !s.ok()) error_ = s.ToString();
    (void)dev.driver->StreamSynchronize(dev.stream);
  }
  ~Workload() {
    (void)dev_.driver->DeviceSynchronize();
    for (DevicePtr p : buffers_) (void)dev_.allocator->Free(p);
  }

  const std::string& error() const { return error_; }
  // The inputs, with input 1 at spare address `spare` (-1: its own).
  std::vector<BufferView> Inputs(int spare = -1) const {
    std::vector<BufferView> in;
    for (int i = 0; i < kInputs; ++i) in.push_back({buffers_[i], kBufBytes});
    if (spare >= 0) in[1] = {buffers_[kInputs + spare], kBufBytes};
    return in;
  }

  TreeFunction Body() const {
    Driver* driver = dev_.driver.get();
    CachingAllocator* allocator = dev_.allocator.get();
    const int kernels = kernels_;
    return [driver, allocator, kernels](std::span<const BufferView> in,
                                        Stream s) -> absl::StatusOr<std::vector<BufferView>> {
      absl::StatusOr<DevicePtr> y = allocator->Allocate(kBufBytes, s);
      if (!y.ok()) return y.status();
      if (absl::Status st = ScaleF32(*driver, s, *y, in[0].ptr, kElems, 0.5f); !st.ok()) return st;
      for (int k = 1; k < kernels; ++k) {
        if (absl::Status st = AddF32(*driver, s, *y, *y, in[k % kInputs].ptr, kElems); !st.ok()) return st;
      }
      return std::vector<BufferView>{{*y, kBufBytes}};
    };
  }

 private:
  BenchDevice& dev_;
  const int kernels_;
  std::vector<DevicePtr> buffers_;
  std::string error_;
};

std::vector<CallInput> AsCallInputs(const std::vector<BufferView>& views) {
  return std::vector<CallInput>(views.begin(), views.end());
}

std::unique_ptr<GraphTree> MakeBenchTree(BenchDevice& dev, bool update_first, std::string* error) {
  TreeOptions options;
  options.max_recordings = 1 << 30;
  options.executables_per_site = update_first ? 2 : 1 << 20;
  options.update_executables_first = update_first;
  options.log = [](TreeLogLevel, std::string_view) {};
  absl::StatusOr<std::unique_ptr<GraphTree>> tree = GraphTree::Create(*dev.allocator, options);
  if (!tree.ok()) {
    *error = tree.status().ToString();
    return nullptr;
  }
  return std::move(*tree);
}

std::vector<std::size_t> AllStatic() {
  std::vector<std::size_t> all;
  for (int i = 0; i < kInputs; ++i) all.push_back(static_cast<std::size_t>(i));
  return all;
}

// GraphTree::Call replaying the workload; `wall`: synchronized every call, real time.
void TreeReplay(benchmark::State& state, BenchDevice* dev, bool wall) {
  Workload w(*dev, static_cast<int>(state.range(0)));
  std::string error = w.error();
  std::unique_ptr<GraphTree> tree = error.empty() ? MakeBenchTree(*dev, true, &error) : nullptr;
  absl::StatusOr<FunctionId> f = absl::InternalError(error);
  if (tree != nullptr)
    f = tree->Register(w.Body(), FunctionOptions{.name = "bench", .static_inputs = AllStatic()});
  if (!f.ok()) {
    state.SkipWithError(f.status().ToString().c_str());
    return;
  }
  const std::vector<CallInput> inputs = AsCallInputs(w.Inputs());
  for (int i = 0; i < 3; ++i) {  // warmup, record, first replay
    if (absl::StatusOr<std::vector<TreeOutput>> out = tree->Call(*f, inputs, dev->stream); !out.ok()) {
      state.SkipWithError(out.status().ToString().c_str());
      return;
    }
  }
  (void)dev->driver->StreamSynchronize(dev->stream);
  int n = 0;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    {
      absl::StatusOr<std::vector<TreeOutput>> out = tree->Call(*f, inputs, dev->stream);
      if (!out.ok()) [[unlikely]] {
        state.SkipWithError(out.status().ToString().c_str());
        break;
      }
      benchmark::DoNotOptimize(out->data());
      if (wall) (void)dev->driver->StreamSynchronize(dev->stream);
    }
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!wall && ++n % kSyncEvery == 0) (void)dev->driver->StreamSynchronize(dev->stream);
  }
  (void)dev->driver->StreamSynchronize(dev->stream);
  state.counters["kernels"] = static_cast<double>(state.range(0));
  state.counters["inputs"] = kInputs;
  state.counters["recordings"] = static_cast<double>(tree->Dump().counters.recordings);
}

// Captures `body` on `inputs` into `pool`; `outputs` gets what it returned (the caller frees them).
absl::StatusOr<OwnedGraph> CaptureWorkload(BenchDevice& dev, const PrivatePool& pool,
                                           const TreeFunction& body, const std::vector<BufferView>& inputs,
                                           std::vector<BufferView>* outputs) {
  return CaptureIntoPool(*dev.allocator, pool, dev.stream, [&](Stream s) {
    absl::StatusOr<std::vector<BufferView>> out = body(inputs, s);
    if (!out.ok()) return out.status();
    *outputs = std::move(*out);
    return absl::OkStatus();
  });
}

// A private pool for a benchmark that captures `w` without a tree; nullopt, the benchmark skipped with the
// reason, when the workload or the pool could not be made.
std::optional<PrivatePool> PoolForWorkload(benchmark::State& state, BenchDevice& dev, const Workload& w) {
  absl::StatusOr<PrivatePool> pool = dev.allocator->CreatePool();
  if (!w.error().empty() || !pool.ok()) {
    state.SkipWithError(w.error().empty() ? pool.status().ToString().c_str() : w.error().c_str());
    return std::nullopt;
  }
  return std::move(*pool);
}

// GraphLaunch of the workload captured once (what the tree replays, without the tree).
void RawLaunch(benchmark::State& state, BenchDevice* dev, bool wall) {
  Workload w(*dev, static_cast<int>(state.range(0)));
  std::optional<PrivatePool> pool = PoolForWorkload(state, *dev, w);
  if (!pool.has_value()) return;
  const TreeFunction body = w.Body();
  const std::vector<BufferView> inputs = w.Inputs();
  std::vector<BufferView> outputs;
  absl::StatusOr<OwnedGraph> graph = CaptureWorkload(*dev, *pool, body, inputs, &outputs);
  absl::StatusOr<OwnedGraphExec> exec =
      graph.ok() ? Instantiate(*dev->driver, *graph) : absl::StatusOr<OwnedGraphExec>(graph.status());
  absl::StatusOr<GraphPin> pin = dev->allocator->PinForGraph(*pool);
  if (!exec.ok() || !pin.ok()) {
    state.SkipWithError(!exec.ok() ? exec.status().ToString().c_str() : pin.status().ToString().c_str());
    return;
  }
  int n = 0;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    if (absl::Status s = dev->driver->GraphLaunch(exec->get(), dev->stream); !s.ok()) [[unlikely]] {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    if (wall) (void)dev->driver->StreamSynchronize(dev->stream);
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!wall && ++n % kSyncEvery == 0) (void)dev->driver->StreamSynchronize(dev->stream);
  }
  (void)dev->driver->StreamSynchronize(dev->stream);
  for (const BufferView& b : outputs) (void)dev->allocator->Free(b.ptr);
  state.counters["kernels"] = static_cast<double>(state.range(0));
}

// The function run eagerly: 100 launches, its output allocated and freed.
void Eager(benchmark::State& state, BenchDevice* dev, bool wall) {
  Workload w(*dev, static_cast<int>(state.range(0)));
  if (!w.error().empty()) {
    state.SkipWithError(w.error().c_str());
    return;
  }
  const TreeFunction body = w.Body();
  const std::vector<BufferView> inputs = w.Inputs();
  int n = 0;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::vector<BufferView>> out = body(inputs, dev->stream);
    if (!out.ok()) [[unlikely]] {
      state.SkipWithError(out.status().ToString().c_str());
      break;
    }
    (void)dev->allocator->Free((*out)[0].ptr);
    if (wall) (void)dev->driver->StreamSynchronize(dev->stream);
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!wall && ++n % kSyncEvery == 0) (void)dev->driver->StreamSynchronize(dev->stream);
  }
  (void)dev->driver->StreamSynchronize(dev->stream);
  state.counters["kernels"] = static_cast<double>(state.range(0));
}

// One call per iteration whose static input 1 moved to a new address: a re-record every time, its
// executable updated in place (`update`, the default policy) or instantiated anew.
void Rerecord(benchmark::State& state, BenchDevice* dev, bool update) {
  Workload w(*dev);
  std::string error = w.error();
  std::unique_ptr<GraphTree> tree = error.empty() ? MakeBenchTree(*dev, update, &error) : nullptr;
  absl::StatusOr<FunctionId> f = absl::InternalError(error);
  if (tree != nullptr) {
    f = tree->Register(w.Body(),
                       FunctionOptions{.name = "bench", .static_inputs = AllStatic(), .warmup_calls = 0});
  }
  if (!f.ok()) {
    state.SkipWithError(f.status().ToString().c_str());
    return;
  }
  if (absl::StatusOr<std::vector<TreeOutput>> out = tree->Call(*f, AsCallInputs(w.Inputs()), dev->stream);
      !out.ok()) {
    state.SkipWithError(out.status().ToString().c_str());
    return;
  }
  int spare = 0;
  for (auto _ : state) {
    const std::vector<CallInput> inputs = AsCallInputs(w.Inputs(spare++));
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<std::vector<TreeOutput>> out = tree->Call(*f, inputs, dev->stream);
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!out.ok()) [[unlikely]] {
      state.SkipWithError(out.status().ToString().c_str());
      break;
    }
    (void)dev->driver->StreamSynchronize(dev->stream);
  }
  const TreeDump d = tree->Dump();
  state.counters["recordings"] = static_cast<double>(d.counters.recordings);
  if (!d.sites.empty()) {
    state.counters["exec_updates"] = static_cast<double>(d.sites[0].executable_counters.updates);
    state.counters["exec_instantiations"] =
        static_cast<double>(d.sites[0].executable_counters.instantiations);
  }
}

// The driver's cost alone: GraphExecUpdate between two captures of the workload (input 1 moved), or a
// fresh GraphInstantiate (and its destroy).
void DriverUpdate(benchmark::State& state, BenchDevice* dev, bool update) {
  Workload w(*dev);
  std::optional<PrivatePool> pool = PoolForWorkload(state, *dev, w);
  if (!pool.has_value()) return;
  const TreeFunction body = w.Body();
  std::vector<OwnedGraph> graphs;
  std::vector<BufferView> outputs;
  for (int k = 0; k < 2; ++k) {
    std::vector<BufferView> out;
    absl::StatusOr<OwnedGraph> g = CaptureWorkload(*dev, *pool, body, w.Inputs(k), &out);
    outputs.insert(outputs.end(), out.begin(), out.end());
    if (!g.ok()) {
      state.SkipWithError(g.status().ToString().c_str());
      return;
    }
    graphs.push_back(std::move(*g));
  }
  absl::StatusOr<OwnedGraphExec> exec = Instantiate(*dev->driver, graphs[0]);
  if (!exec.ok()) {
    state.SkipWithError(exec.status().ToString().c_str());
    return;
  }
  int k = 0;
  for (auto _ : state) {
    const Graph g = graphs[++k % 2].get();
    const Clock::time_point t0 = Clock::now();
    if (update) {
      absl::StatusOr<GraphUpdateResult> r = dev->driver->GraphExecUpdate(exec->get(), g);
      if (!r.ok() || *r != GraphUpdateResult::kSuccess) [[unlikely]] {
        state.SkipWithError("GraphExecUpdate refused the update");
        break;
      }
    } else {
      absl::StatusOr<GraphExec> fresh = dev->driver->GraphInstantiate(g);
      if (!fresh.ok()) [[unlikely]] {
        state.SkipWithError(fresh.status().ToString().c_str());
        break;
      }
      (void)dev->driver->GraphExecDestroy(*fresh);
    }
    state.SetIterationTime(Seconds(Clock::now() - t0));
  }
  exec->Reset();
  graphs.clear();
  for (const BufferView& b : outputs) (void)dev->allocator->Free(b.ptr);
  state.counters["graph_nodes"] = kKernels;
}

// The part of a re-record that does not depend on the executable policy: capturing the workload into a
// pool (the tree adds a checkpoint and the launch).
void Capture(benchmark::State& state, BenchDevice* dev, bool /*unused*/) {
  Workload w(*dev);
  std::optional<PrivatePool> pool = PoolForWorkload(state, *dev, w);
  if (!pool.has_value()) return;
  const TreeFunction body = w.Body();
  const std::vector<BufferView> inputs = w.Inputs();
  std::vector<BufferView> outputs;
  for (auto _ : state) {
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<OwnedGraph> g = CaptureWorkload(*dev, *pool, body, inputs, &outputs);
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!g.ok()) [[unlikely]] {
      state.SkipWithError(g.status().ToString().c_str());
      break;
    }
    g->Reset();
    for (const BufferView& b : outputs) (void)dev->allocator->Free(b.ptr);
  }
  state.counters["graph_nodes"] = kKernels;
}

void Register(BenchDevice& dev) {
  const std::string d = dev.kind;
  // Replay, raw launch and eager run with the 100-kernel workload and with 1 kernel (which leaves the
  // tree's own host time, on the simulated device too: there the kernels run on the calling thread).
  auto add = [&](const std::string& name, auto fn, bool flag, bool one_kernel_too) {
    auto* b = benchmark::RegisterBenchmark(absl::StrCat("graph_tree/", name, "/", d).c_str(), fn, &dev, flag)
                  ->UseManualTime()
                  ->Unit(benchmark::kMicrosecond)
                  ->ArgName("kernels");
    if (one_kernel_too) b->Arg(1);
    b->Arg(kKernels);
  };
  add("replay_host", TreeReplay, false, true);
  add("raw_launch_host", RawLaunch, false, true);
  add("eager_host", Eager, false, true);
  add("replay_wall", TreeReplay, true, true);
  add("raw_launch_wall", RawLaunch, true, true);
  add("eager_wall", Eager, true, true);
  for (const bool update : {true, false}) {
    benchmark::RegisterBenchmark(
        absl::StrCat("graph_tree/rerecord_", update ? "update" : "instantiate", "/", d).c_str(), Rerecord,
        &dev, update)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(kRerecords);
  }
  add("driver_update", DriverUpdate, true, false);
  add("driver_instantiate", DriverUpdate, false, false);
  add("capture", Capture, false, false);
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  std::vector<std::unique_ptr<graphalloc::bench::BenchDevice>> devices =
      graphalloc::bench::MakeBenchDevices();
  for (auto& device : devices) graphalloc::bench::Register(*device);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
