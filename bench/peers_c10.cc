// PyTorch's c10 CUDA caching allocator and graphalloc side by side in one binary (built only when CMake
// finds PyTorch; see bench/CMakeLists.txt).
//
//   hit/graphalloc-<device>/<bytes>   graphalloc's hit path, the same code as in allocator_bench
//   hit/c10/<bytes>                   c10 raw_alloc_with_stream + raw_delete of one size on one stream
//   churn/c10/<live>                  the churn workload of allocator_bench (same sizes, same seed)
//   replay/<impl>/<trace>             the shipped traces (traces/*.csv.gz) replayed from an empty allocator
//   replay_settled/<impl>/<trace>     ... the same, the device settled after each release
//   replay_warm/<impl>/<trace>        ... and with the cache the previous replay left; <impl> is
//                                     graphalloc-cuda or c10_<config> (bench/trace_replay_support.h)
//
// c10's configuration is read once per process from PYTORCH_ALLOC_CONF (or, when that is unset,
// PYTORCH_CUDA_ALLOC_CONF), so the replay names say which one ran: c10_native, c10_expandable
// (expandable_segments:True) or c10_cudaMallocAsync (backend:cudaMallocAsync); run the binary once per
// configuration (bench/run_replay_bench.sh does). The context key "c10_conf" has the variable's text.
//
// The c10 variants run only on a GPU; without one they are skipped with a line on stderr.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "bench/bench_support.h"
#include "bench/c10_peer.h"
#include "bench/trace_replay_support.h"
#include "graphalloc/allocator/device/cuda_driver.h"

namespace graphalloc::bench {
namespace {

struct C10Peer {
  Driver* driver = nullptr;        // the GPU's graphalloc driver, which owns the stream
  Stream stream = kDefaultStream;  // a stream of its own, not graphalloc's
  void* native_stream() const { return NativeFromStream(stream); }
};

bool C10Pair(benchmark::State& state, void* stream, std::size_t size) {
  void* p = c10peer::Alloc(size, stream);
  if (p == nullptr) [[unlikely]] {
    state.SkipWithError(c10peer::LastError());
    return false;
  }
  benchmark::DoNotOptimize(p);
  if (!c10peer::Free(p)) [[unlikely]] {
    state.SkipWithError(c10peer::LastError());
    return false;
  }
  return true;
}

void BM_C10Hit(benchmark::State& state, C10Peer* peer, std::size_t size) {
  void* stream = peer->native_stream();
  bool ok = true;
  for (int i = 0; ok && i < kWarmupPairs; ++i) ok = C10Pair(state, stream, size);
  for (auto _ : state) {
    if (!ok || !C10Pair(state, stream, size)) break;
  }
  state.SetItemsProcessed(state.iterations());
}

struct C10ChurnState final : ChurnStateBase {
  explicit C10ChurnState(std::size_t live_blocks) : live(live_blocks) {}
  ~C10ChurnState() override {
    for (const ChurnLive::Block& block : live.blocks) {
      if (block.ptr != 0) (void)c10peer::Free(reinterpret_cast<void*>(block.ptr));
    }
    (void)c10peer::EmptyCache();
  }
  ChurnLive live;
};

void BM_C10Churn(benchmark::State& state, C10Peer* peer, std::size_t live_blocks) {
  const std::string key = ChurnName("c10", live_blocks);
  void* stream = peer->native_stream();
  auto alloc = [stream](std::size_t size) {
    return reinterpret_cast<std::uintptr_t>(c10peer::Alloc(size, stream));
  };
  auto* churn = static_cast<C10ChurnState*>(FindChurnState(key));
  if (churn == nullptr) {
    auto owned = std::make_unique<C10ChurnState>(live_blocks);
    if (!owned->live.Fill(alloc)) {
      state.SkipWithError((std::string("churn fill failed: ") + c10peer::LastError()).c_str());
      return;
    }
    churn = owned.get();
    SetChurnState(key, std::move(owned));
  }
  ChurnLoop(
      state, churn->live, alloc,
      [](std::uintptr_t ptr) { return c10peer::Free(reinterpret_cast<void*>(ptr)); },
      [] { return std::string(c10peer::LastError()); });
}

// PyTorch's c10 allocator as a replay target (trace_replay_support.h), on the streams graphalloc's
// replay on the same GPU uses.
class C10ReplayTarget {
 public:
  explicit C10ReplayTarget(TraceStreams* streams) : streams_(streams) {}

  absl::Status Prepare(const ReplayProgram& program) {
    ResetChurnState();  // a churn's live blocks would stay in c10's pool
    if (absl::Status s = EmptyCache(); !s.ok()) return s;
    absl::StatusOr<std::vector<Stream>> streams = streams_->For(program);
    if (!streams.ok()) return streams.status();
    native_.clear();
    for (Stream stream : *streams) native_.push_back(NativeFromStream(stream));
    return absl::OkStatus();
  }
  std::uintptr_t Alloc(std::size_t size, std::uint16_t stream) {
    return reinterpret_cast<std::uintptr_t>(c10peer::Alloc(size, native_[stream]));
  }
  bool Free(std::uintptr_t ptr) { return c10peer::Free(reinterpret_cast<void*>(ptr)); }
  std::string Error() const { return c10peer::LastError(); }
  absl::Status EmptyCache() {
    if (c10peer::EmptyCache()) return absl::OkStatus();
    return absl::InternalError(c10peer::LastError());
  }
  void Finish(benchmark::State&) { (void)c10peer::EmptyCache(); }

 private:
  TraceStreams* streams_;
  std::vector<void*> native_;
};

// "c10_native", "c10_expandable" or "c10_cudaMallocAsync" (see the top comment); `conf` gets the
// variable c10 read, as NAME=VALUE.
std::string C10Impl(std::string* conf) {
  const char* var = "PYTORCH_ALLOC_CONF";
  const char* value = std::getenv(var);
  if (value == nullptr) {
    var = "PYTORCH_CUDA_ALLOC_CONF";
    value = std::getenv(var);
  }
  *conf = value == nullptr ? std::string("(unset)") : std::string(var) + "=" + value;
  if (absl::StrContains(c10peer::Name(), "cudaMallocAsync")) return "c10_cudaMallocAsync";
  bool expandable = false;
  if (value != nullptr) {
    for (absl::string_view option : absl::StrSplit(value, ',')) {
      std::vector<absl::string_view> kv = absl::StrSplit(option, absl::MaxSplits(':', 1));
      if (kv.size() == 2 && absl::StripAsciiWhitespace(kv[0]) == "expandable_segments") {
        expandable = absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(kv[1]), "true");
      }
    }
  }
  return expandable ? "c10_expandable" : "c10_native";
}

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  std::vector<std::unique_ptr<BenchDevice>> devices = MakeBenchDevices();
  BenchDevice* gpu = nullptr;
  for (auto& device : devices) {
    if (device->kind == "cuda") gpu = device.get();
  }

  std::unique_ptr<C10Peer> peer;
  if (gpu == nullptr) {
    std::fprintf(stderr, "peers_c10: no GPU, skipping the c10 allocator benchmarks\n");
    benchmark::AddCustomContext("c10_allocator", "skipped: no GPU");
  } else {
    absl::StatusOr<int> count = CudaDriver::DeviceCount();
    absl::StatusOr<Stream> stream = gpu->driver->StreamCreate();
    if (!count.ok() || !stream.ok()) {
      std::fprintf(stderr, "peers_c10: skipping c10: %s\n",
                   (!count.ok() ? count.status() : stream.status()).ToString().c_str());
    } else if (!c10peer::Init(*count)) {
      std::fprintf(stderr, "peers_c10: skipping c10: %s\n", c10peer::LastError());
      (void)gpu->driver->StreamDestroy(*stream);
    } else {
      peer = std::make_unique<C10Peer>();
      peer->driver = gpu->driver.get();
      peer->stream = *stream;
      benchmark::AddCustomContext("c10_allocator", c10peer::Name());
    }
  }

  for (auto& device : devices) RegisterGraphallocHitPath(*device);
  if (peer != nullptr) {
    for (std::size_t size : kHitSizes) {
      benchmark::RegisterBenchmark(HitName("c10", size).c_str(), BM_C10Hit, peer.get(), size);
    }
    RegisterGraphallocChurn(*gpu);  // graphalloc's churn on the GPU too, beside c10's
    for (std::size_t live : kChurnLiveBlocks) {
      benchmark::RegisterBenchmark(ChurnName("c10", live).c_str(), BM_C10Churn, peer.get(), live);
    }
  }

  // Trace replays: graphalloc-cuda and c10 on the same streams of the same GPU.
  absl::StatusOr<std::vector<ReplayProgram>> programs = std::vector<ReplayProgram>{};
  std::unique_ptr<TraceStreams> trace_streams;
  std::unique_ptr<GraphallocReplayTarget> graphalloc_replay;
  std::unique_ptr<C10ReplayTarget> c10_replay;
  if (peer != nullptr) {
    programs = LoadShippedTraces();
    if (!programs.ok()) {
      std::fprintf(stderr, "peers_c10: skipping the trace replays: %s\n",
                   programs.status().ToString().c_str());
    } else {
      std::string conf;
      const std::string c10_impl = C10Impl(&conf);
      benchmark::AddCustomContext("c10_conf", conf);
      const char* graphalloc_conf = std::getenv("GRAPHALLOC_CONF");
      benchmark::AddCustomContext("graphalloc_conf",
                                  graphalloc_conf != nullptr ? graphalloc_conf : "(unset: defaults)");
      trace_streams = std::make_unique<TraceStreams>(gpu->driver);
      graphalloc_replay = std::make_unique<GraphallocReplayTarget>(gpu->driver, trace_streams.get());
      c10_replay = std::make_unique<C10ReplayTarget>(trace_streams.get());
      RegisterReplays(gpu->Impl(), graphalloc_replay.get(), *programs, /*real_device=*/true);
      RegisterReplays(c10_impl, c10_replay.get(), *programs, /*real_device=*/true);
    }
  }

  benchmark::RunSpecifiedBenchmarks();
  ResetChurnState();
  c10_replay.reset();
  graphalloc_replay.reset();
  if (peer != nullptr) {
    (void)c10peer::EmptyCache();
    (void)peer->driver->StreamSynchronize(peer->stream);
    (void)peer->driver->StreamDestroy(peer->stream);
  }
  trace_streams.reset();
  devices.clear();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) { return graphalloc::bench::Main(argc, argv); }
