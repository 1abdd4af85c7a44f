// The shipped allocation traces (traces/*.csv.gz, real PyTorch workloads) replayed through graphalloc:
//
//   replay/graphalloc-<device>/<trace>          from an empty allocator each iteration (cache emptied,
//   untimed) replay_settled/graphalloc-cuda/<trace>      the same, the device settled after each release (GPU
//   only) replay_warm/graphalloc-<device>/<trace>     with the cache the previous replay left (steady state)
//
// on the simulated device always and on GPU 0 when CudaDriver::Create(0) succeeds. Only the allocate and
// free calls are timed, the memory is never touched; bench/trace_replay_support.h says what is measured
// and why. Each row also counts the driver calls of a replay by kind (create_n, map_n, access_n, ... and
// their wall time: which call a cold replay spends its time in). PyTorch's c10 allocator replays the same
// traces in peers_c10 (beside graphalloc-cuda, in the same process, without the driver counters);
// bench/run_replay_bench.sh runs both and prints the comparison.
// GRAPHALLOC_TRACE_DIR overrides the folder of the traces; GRAPHALLOC_CONF configures graphalloc.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench/bench_support.h"
#include "bench/trace_replay_support.h"

namespace graphalloc::bench {
namespace {

int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  absl::StatusOr<std::vector<ReplayProgram>> programs = LoadShippedTraces();
  if (!programs.ok()) {
    std::fprintf(stderr, "replay_bench: %s\n", programs.status().ToString().c_str());
    return 2;
  }
  const char* conf = std::getenv("GRAPHALLOC_CONF");
  benchmark::AddCustomContext("graphalloc_conf", conf != nullptr ? conf : "(unset: defaults)");

  std::vector<std::unique_ptr<BenchDevice>> devices = MakeBenchDevices();
  std::vector<std::unique_ptr<TraceStreams>> streams;
  std::vector<std::unique_ptr<GraphallocReplayTarget>> targets;
  for (auto& device : devices) {
    streams.push_back(std::make_unique<TraceStreams>(device->driver));
    targets.push_back(
        std::make_unique<GraphallocReplayTarget>(device->driver, streams.back().get(), /*split=*/true));
    RegisterReplays(device->Impl(), targets.back().get(), *programs, /*real_device=*/device->kind == "cuda");
  }
  benchmark::RunSpecifiedBenchmarks();
  targets.clear();
  streams.clear();
  devices.clear();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) { return graphalloc::bench::Main(argc, argv); }
