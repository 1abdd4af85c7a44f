// The graphed training step against the same step run eagerly: the example MLP with dropout
// (examples/mlp/mlp.h), one optimizer step (forward, backward, cloned gradients, SGD) per iteration, on
// the simulated device and on GPU 0. The MLP is small, so an eager step is bound by its ~25 kernel
// launches and host work, which a graph replay replaces with two launches: the speedup issue 7 asks for.
//
//   Step/<device>/<graphed|eager>/<size>   time per step (real time, stream synchronized at the end)
//   Speedup/<device>/<size>                alternating rounds of 200 eager and 200 graphed steps;
//                                          counters eager_step_us, graphed_step_us, speedup
// Sizes: small (batch 32, 64 -> 128 -> 16), medium (batch 64, 256 -> 512 -> 64).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_support.h"
#include "examples/mlp/mlp.h"

namespace graphalloc::bench {
namespace {

using mlp::MlpConfig;
using mlp::MlpTrainer;

constexpr int kWarmupSteps = 3;  // warmup, recording, first replay
constexpr int kRoundSteps = 200;

struct Size {
  const char* name;
  MlpConfig config;
};

std::vector<Size> Sizes() {
  MlpConfig small;
  MlpConfig medium;
  medium.batch = 64;
  medium.in = 256;
  medium.hidden = 512;
  medium.out = 64;
  return {{"small", small}, {"medium", medium}};
}

std::unique_ptr<MlpTrainer> MakeTrainer(benchmark::State& state, BenchDevice& device, MlpConfig config,
                                        bool graphed) {
  config.graphed = graphed;
  config.max_steps = 4096;  // the loss history is a ring
  absl::StatusOr<std::unique_ptr<MlpTrainer>> trainer =
      MlpTrainer::Create(*device.allocator, device.driver, config, device.stream);
  if (!trainer.ok()) {
    state.SkipWithError(trainer.status().ToString().c_str());
    return nullptr;
  }
  for (int s = 0; s < kWarmupSteps; ++s) {
    if (absl::Status st = (*trainer)->Step(); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return nullptr;
    }
  }
  (void)device.driver->StreamSynchronize(device.stream);
  return std::move(*trainer);
}

void BM_Step(benchmark::State& state, BenchDevice* device, MlpConfig config, bool graphed) {
  std::unique_ptr<MlpTrainer> trainer = MakeTrainer(state, *device, config, graphed);
  if (trainer == nullptr) return;
  for (auto _ : state) {
    if (absl::Status st = trainer->Step(); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  (void)device->driver->StreamSynchronize(device->stream);
  state.counters["steps_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Seconds for `steps` steps of `trainer`, the stream synchronized at both ends.
double TimeSteps(MlpTrainer& trainer, BenchDevice& device, int steps, absl::Status* error) {
  (void)device.driver->StreamSynchronize(device.stream);
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps && error->ok(); ++s) *error = trainer.Step();
  (void)device.driver->StreamSynchronize(device.stream);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void BM_Speedup(benchmark::State& state, BenchDevice* device, MlpConfig config) {
  std::unique_ptr<MlpTrainer> eager = MakeTrainer(state, *device, config, /*graphed=*/false);
  std::unique_ptr<MlpTrainer> graphed = MakeTrainer(state, *device, config, /*graphed=*/true);
  if (eager == nullptr || graphed == nullptr) return;
  double eager_s = 0, graphed_s = 0;
  for (auto _ : state) {
    absl::Status error;
    const double e = TimeSteps(*eager, *device, kRoundSteps, &error);
    const double g = TimeSteps(*graphed, *device, kRoundSteps, &error);
    if (!error.ok()) {
      state.SkipWithError(error.ToString().c_str());
      break;
    }
    eager_s += e;
    graphed_s += g;
    state.SetIterationTime(e + g);
  }
  const double steps = static_cast<double>(state.iterations()) * kRoundSteps;
  if (steps == 0 || graphed_s == 0) return;
  state.counters["eager_step_us"] = eager_s / steps * 1e6;
  state.counters["graphed_step_us"] = graphed_s / steps * 1e6;
  state.counters["speedup"] = eager_s / graphed_s;
}

}  // namespace
}  // namespace graphalloc::bench

int main(int argc, char** argv) {
  using namespace graphalloc::bench;
  benchmark::Initialize(&argc, argv);
  std::vector<std::unique_ptr<BenchDevice>> devices = MakeBenchDevices();
  for (const std::unique_ptr<BenchDevice>& device : devices) {
    for (const Size& size : Sizes()) {
      // The simulated device runs kernels as host loops: the small model only, for a quick check.
      if (device->kind == "sim" && std::string(size.name) != "small") continue;
      for (bool graphed : {true, false}) {
        const std::string name =
            "Step/" + device->kind + "/" + (graphed ? "graphed" : "eager") + "/" + size.name;
        benchmark::RegisterBenchmark(name.c_str(), BM_Step, device.get(), size.config, graphed)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
      const std::string name = "Speedup/" + device->kind + "/" + size.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_Speedup, device.get(), size.config)
          ->UseManualTime()
          ->Iterations(device->kind == "sim" ? 1 : 10)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  devices.clear();
  return 0;
}
