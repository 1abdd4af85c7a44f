// Trains the example MLP (mlp.h) twice, through a graphed step and eagerly, and checks that the two runs
// give bit-identical losses and weights.
//
//   train_mlp [--device=sim|cuda] [--steps=100] [--micro-batches=1] [--recompute] [--alias-gradients]
//
// Exits 0 when the runs agree bit for bit, 1 when they differ, 2 on an error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "examples/mlp/mlp.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/cuda_driver.h"
#include "graphalloc/allocator/device/sim_driver.h"

namespace {

using graphalloc::mlp::MlpConfig;
using graphalloc::mlp::MlpTrainer;

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

absl::StatusOr<Run> Train(graphalloc::CachingAllocator& allocator, std::shared_ptr<graphalloc::Driver> driver,
                          MlpConfig config, int steps, graphalloc::Stream stream) {
  absl::StatusOr<std::unique_ptr<MlpTrainer>> trainer = MlpTrainer::Create(allocator, driver, config, stream);
  if (!trainer.ok()) return trainer.status();
  for (int s = 0; s < steps; ++s) {
    if (absl::Status st = (*trainer)->Step(); !st.ok()) return st;
  }
  Run run;
  absl::StatusOr<std::vector<float>> losses = (*trainer)->Losses();
  if (!losses.ok()) return losses.status();
  run.losses = std::move(*losses);
  absl::StatusOr<std::vector<std::vector<float>>> params = (*trainer)->Parameters();
  if (!params.ok()) return params.status();
  run.params = std::move(*params);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "sim";
  int steps = 100;
  MlpConfig config;
  CLI::App app{
      "Trains the example MLP through a graphed step and eagerly and checks that the two runs give "
      "bit-identical losses and weights\nExit codes: 0 bit-identical, 1 different, 2 an error"};
  app.add_option("--device", device, "sim or cuda")
      ->check(CLI::IsMember({"sim", "cuda"}))
      ->capture_default_str();
  app.add_option("--steps", steps, "Optimizer steps (at least 1)")->capture_default_str();
  app.add_option("--micro-batches", config.micro_batches, "Forward/backward pairs per optimizer step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--recompute", config.recompute, "Recompute the hidden layer in the backward");
  app.add_flag("--alias-gradients", config.alias_gradients,
               "Return the gradients as aliases of the graph's static buffers");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (steps < 1) steps = 1;
  config.max_steps = static_cast<std::size_t>(steps);

  std::shared_ptr<graphalloc::Driver> driver;
  if (device == "cuda") {
    absl::StatusOr<std::unique_ptr<graphalloc::CudaDriver>> cuda = graphalloc::CudaDriver::Create(0);
    if (!cuda.ok()) {
      std::fprintf(stderr, "train_mlp: no GPU: %s\n", std::string(cuda.status().message()).c_str());
      return 2;
    }
    driver = std::move(*cuda);
  } else {
    absl::StatusOr<std::unique_ptr<graphalloc::SimDriver>> sim = graphalloc::SimDriver::Create();
    if (!sim.ok()) {
      std::fprintf(stderr, "train_mlp: %s\n", std::string(sim.status().message()).c_str());
      return 2;
    }
    driver = std::move(*sim);
  }
  absl::StatusOr<std::unique_ptr<graphalloc::CachingAllocator>> allocator =
      graphalloc::CachingAllocator::Create(driver);
  if (!allocator.ok()) {
    std::fprintf(stderr, "train_mlp: %s\n", std::string(allocator.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<graphalloc::Stream> stream = driver->StreamCreate();
  if (!stream.ok()) {
    std::fprintf(stderr, "train_mlp: %s\n", std::string(stream.status().message()).c_str());
    return 2;
  }

  std::printf("MLP %ux%ux%u, batch %u, dropout %.2f, seed %llu, %d steps of %d micro-batch(es)%s%s on %s\n",
              config.in, config.hidden, config.out, config.batch, static_cast<double>(config.dropout),
              static_cast<unsigned long long>(config.seed), steps, config.micro_batches,
              config.recompute ? ", recomputing the hidden layer" : "",
              config.alias_gradients ? ", aliased gradients" : "", device.c_str());
  MlpConfig graphed_config = config, eager_config = config;
  graphed_config.graphed = true;
  eager_config.graphed = false;
  absl::StatusOr<Run> graphed = Train(**allocator, driver, graphed_config, steps, *stream);
  absl::StatusOr<Run> eager = Train(**allocator, driver, eager_config, steps, *stream);
  (void)driver->StreamDestroy(*stream);
  if (!graphed.ok() || !eager.ok()) {
    std::fprintf(stderr, "train_mlp: %s\n",
                 std::string((graphed.ok() ? eager.status() : graphed.status()).message()).c_str());
    return 2;
  }
  const std::size_t per_step = static_cast<std::size_t>(config.micro_batches);
  for (std::size_t s = 0; s < graphed->losses.size() / per_step; ++s) {
    if (s % 10 != 0 && s + 1 != graphed->losses.size() / per_step) continue;
    std::printf("step %3zu  loss graphed %.9g  eager %.9g%s\n", s,
                static_cast<double>(graphed->losses[s * per_step]),
                static_cast<double>(eager->losses[s * per_step]),
                std::memcmp(&graphed->losses[s * per_step], &eager->losses[s * per_step], sizeof(float)) == 0
                    ? ""
                    : "  DIFFERENT");
  }
  const bool same_losses =
      graphed->losses.size() == eager->losses.size() &&
      std::memcmp(graphed->losses.data(), eager->losses.data(), graphed->losses.size() * sizeof(float)) == 0;
  bool same_params = graphed->params.size() == eager->params.size();
  for (std::size_t p = 0; same_params && p < graphed->params.size(); ++p) {
    same_params = std::memcmp(graphed->params[p].data(), eager->params[p].data(),
                              graphed->params[p].size() * sizeof(float)) == 0;
  }
  std::printf("losses %s, weights %s\n", same_losses ? "bit-identical" : "DIFFER",
              same_params ? "bit-identical" : "DIFFER");
  return same_losses && same_params ? 0 : 1;
}
