// The end-to-end example of the gradient-lifetime layer: a two-layer perceptron with dropout,
//   h = x W1^T + b1,  a = relu(h),  d = dropout(a, p),  y = d W2^T + b2,  loss = mean((y - t)^2),
// trained with SGD through a GraphedStep, graphed or eagerly, on the GPU (kernels) or the simulated device
// (host closures). Every kernel sums in a fixed order (mlp_op_bodies.h) and the dropout masks come from
// the step's RNG state pairs, so a graphed run and an eager run give bit-identical losses and weights.
//
// MlpTrainer owns the parameters, a synthetic data set (inputs and targets from a fixed teacher, made on
// the host from the seed), the step and the loss history; Step() runs one optimizer step of
// `micro_batches` forward/backward pairs, accumulating their gradients, without synchronizing.
#ifndef GRAPHALLOC_EXAMPLES_MLP_MLP_H_
#define GRAPHALLOC_EXAMPLES_MLP_MLP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/lifetime/graphed_step.h"

namespace graphalloc::mlp {

struct MlpConfig {
  std::uint32_t batch = 32;
  std::uint32_t in = 64;
  std::uint32_t hidden = 128;
  std::uint32_t out = 16;
  float dropout = 0.2f;
  float lr = 0.5f;
  std::uint64_t seed = 2026;  // parameters, data and the dropout generator
  int micro_batches = 1;      // forward/backward pairs per optimizer step, gradients accumulated
  int data_batches = 8;       // distinct batches, cycled
  // Activation checkpointing: the forward saves only its inputs and the backward recomputes the hidden
  // layer, dropout included, from the backward generator (same masks as the forward).
  bool recompute = false;
  bool graphed = true;
  // Return the gradients as aliases of the graph's static buffers (they are consumed at once).
  bool alias_gradients = false;
  // Capacity of the loss history, in steps: a ring, so Losses() is the whole run while it fits.
  std::size_t max_steps = 1000;
};

// The forward and backward functions of the model (for a GraphedStep over params W1, b1, W2, b2; inputs
// x, t; one output, the loss; gradient slots gW1, gb1, gW2, gb2).
ForwardFunction MlpForward(CachingAllocator& allocator, const MlpConfig& config);
BackwardFunction MlpBackward(CachingAllocator& allocator, const MlpConfig& config);

class MlpTrainer {
 public:
  static absl::StatusOr<std::unique_ptr<MlpTrainer>> Create(CachingAllocator& allocator,
                                                            std::shared_ptr<Driver> driver, MlpConfig config,
                                                            Stream stream);
  ~MlpTrainer();
  MlpTrainer(const MlpTrainer&) = delete;
  MlpTrainer& operator=(const MlpTrainer&) = delete;

  // One optimizer step on the trainer's stream (no synchronization).
  absl::Status Step();
  // The loss of every micro-batch so far, in order, or the ring of the last max_steps steps' losses once
  // the run is longer (synchronizes the stream).
  absl::StatusOr<std::vector<float>> Losses();
  // W1, b1, W2, b2 as they are now (synchronizes the stream).
  absl::StatusOr<std::vector<std::vector<float>>> Parameters();

  GraphedStep& step() { return *step_; }
  const MlpConfig& config() const { return config_; }
  int steps_run() const { return steps_; }

 private:
  MlpTrainer(CachingAllocator& allocator, std::shared_ptr<Driver> driver, MlpConfig config, Stream stream)
      : allocator_(allocator), driver_(std::move(driver)), config_(config), stream_(stream) {}
  absl::Status Init();
  absl::StatusOr<DevicePtr> Upload(const std::vector<float>& values);

  CachingAllocator& allocator_;
  std::shared_ptr<Driver> driver_;
  const MlpConfig config_;
  const Stream stream_;
  std::vector<DevicePtr> owned_;     // everything below, freed in the destructor
  std::vector<BufferView> params_;   // W1, b1, W2, b2
  std::vector<BufferView> accum_;    // gradient accumulators (micro_batches > 1)
  std::vector<BufferView> inputs_;   // x of each data batch
  std::vector<BufferView> targets_;  // t of each data batch
  BufferView one_;                   // the loss's incoming gradient, 1.0
  DevicePtr losses_ = 0;             // a ring of max_steps * micro_batches floats
  std::shared_ptr<RngStatePairs> rng_;
  std::unique_ptr<GraphedStep> step_;
  int steps_ = 0;
  int micro_batches_run_ = 0;
};

}  // namespace graphalloc::mlp

#endif  // GRAPHALLOC_EXAMPLES_MLP_MLP_H_
