#include "python/csrc/graphs/torch_generator_participant.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <utility>

#include "absl/strings/str_format.h"

namespace graphalloc_torch {
namespace {

struct GeneratorCaptured final : graphalloc::CaptureParticipant::Captured {
  std::uint64_t advance = 0;  // how far the recording moves the generator's offset
};

}  // namespace

// A CUDAGraph never captured: registering it with a generator is how PyTorch hands a graph the
// generator's state (CUDAGraph::register_generator_state), which it keeps in a protected member.
class TorchGeneratorParticipant::StateHandle final : public at::cuda::CUDAGraph {
 public:
  explicit StateHandle(const at::Generator& generator) {
    generator.get<at::CUDAGeneratorImpl>()->register_graph(this);
    TORCH_CHECK(captured_generator_states_.size() == 1, "graphalloc: registering a CUDA generator gave ",
                captured_generator_states_.size(), " states, expected 1");
    state_ = captured_generator_states_.begin()->first.get();
  }
  at::CUDAGeneratorState* state() const { return state_; }

 private:
  at::CUDAGeneratorState* state_ = nullptr;
};

TorchGeneratorParticipant::TorchGeneratorParticipant(at::Generator generator)
    : generator_(std::move(generator)) {
  TORCH_CHECK(generator_.defined() && generator_.device().is_cuda(),
              "graphalloc: a graph's generators must be CUDA generators, got ",
              generator_.defined() ? generator_.device().str() : std::string("an undefined generator"));
  handle_ = std::make_unique<StateHandle>(generator_);
  state_ = handle_->state();
}

TorchGeneratorParticipant::~TorchGeneratorParticipant() = default;

absl::Status TorchGeneratorParticipant::OnCaptureBegin(std::uint64_t /*capture_id*/) {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  if (state_->capturing_) {
    return absl::FailedPreconditionError(
        "graphalloc: a CUDA generator of this graph is already part of another capture (one capture at a "
        "time may draw from it)");
  }
  state_->capturing_ = true;
  state_->offset_intragraph_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<graphalloc::CaptureParticipant::Captured>>
TorchGeneratorParticipant::OnCaptureEnd() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  auto captured = std::make_unique<GeneratorCaptured>();
  captured->advance = state_->offset_intragraph_;
  state_->capturing_ = false;
  return captured;
}

void TorchGeneratorParticipant::OnCaptureCancel() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  state_->capturing_ = false;
}

absl::Status TorchGeneratorParticipant::ArmReplay(const Captured& captured, graphalloc::Stream stream) {
  const auto& mine = static_cast<const GeneratorCaptured&>(captured);
  if (mine.advance == 0) return absl::OkStatus();  // the recording drew nothing from it
  try {
    const c10::DeviceIndex device = generator_.device().index();
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
        static_cast<cudaStream_t>(graphalloc::NativeFromStream(stream)), device));
    std::lock_guard<std::mutex> lock(generator_.mutex());
    state_->seed_extragraph_.fill_(static_cast<int64_t>(state_->seed_));
    state_->offset_extragraph_.fill_(static_cast<int64_t>(state_->philox_offset_per_thread_));
    state_->philox_offset_per_thread_ += mine.advance;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrFormat("graphalloc: preparing a CUDA generator for a replay: %s",
                                               e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace graphalloc_torch
