// A PyTorch CUDA generator (torch.cuda.default_generators[d], or a torch.Generator("cuda")) as a capture
// participant of graphalloc's graph tree (graph/capture_participant.h), so that random ops inside a
// recording draw, at every replay, exactly what the same eager calls would.
//
// PyTorch's own graphs drive a generator through the state every graph registers with
// (CUDAGeneratorState: capture prologue and epilogue, a replay prologue before each launch), reached only
// through at::cuda::CUDAGraph. The participant takes part the same way: it registers a CUDAGraph object of
// its own, never captured, to obtain the state, and then does what the prologues do:
//   - capture begin: the state enters capture mode with its in-graph offset at 0, so kernels captured
//     meanwhile read the seed and base offset from the state's device slots, plus a fixed in-graph offset;
//   - capture end: it leaves capture mode; the recording keeps how far the capture advanced the offset;
//   - before each launch (on the launch stream): the slots get the generator's seed and current offset, and
//     the offset moves on by the recording's advance, as the eager calls would have moved it.
// A recording that drew nothing from the generator costs nothing at launch.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GENERATOR_PARTICIPANT_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GENERATOR_PARTICIPANT_H_

#include <ATen/core/Generator.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <cstdint>
#include <memory>

#include "graphalloc/graph/capture_participant.h"

namespace graphalloc_torch {

class TorchGeneratorParticipant final : public graphalloc::CaptureParticipant {
 public:
  // `generator` must be a CUDA generator; throws c10::Error otherwise.
  explicit TorchGeneratorParticipant(at::Generator generator);
  ~TorchGeneratorParticipant() override;
  TorchGeneratorParticipant(const TorchGeneratorParticipant&) = delete;
  TorchGeneratorParticipant& operator=(const TorchGeneratorParticipant&) = delete;

  absl::Status OnCaptureBegin(std::uint64_t capture_id) override;
  absl::StatusOr<std::unique_ptr<Captured>> OnCaptureEnd() override;
  void OnCaptureCancel() override;
  absl::Status ArmReplay(const Captured& captured, graphalloc::Stream stream) override;

  const at::Generator& generator() const { return generator_; }

 private:
  class StateHandle;  // the registered CUDAGraph that hands out the state

  at::Generator generator_;
  std::unique_ptr<StateHandle> handle_;
  at::CUDAGeneratorState* state_ = nullptr;  // owned by the generator, kept alive by handle_'s registration
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GENERATOR_PARTICIPANT_H_
