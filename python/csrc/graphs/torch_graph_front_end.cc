#include "python/csrc/graphs/torch_graph_front_end.h"

#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <stdexcept>

#include "graphalloc/allocator/core/default_allocator.h"

namespace graphalloc_torch {

GraphFrontEnd::GraphFrontEnd(const FrontEndOptions& options) : options_(options) {
  const c10::DeviceIndex device = options_.device;
  const std::string backend = c10::cuda::CUDACachingAllocator::get()->name();
  if (backend != "graphalloc") {
    throw std::runtime_error(
        "graphalloc's graph front ends need graphalloc as PyTorch's CUDA allocator (PyTorch's is '" +
        backend +
        "'): call graphalloc.torch.install() before CUDA is first used, e.g. as the first line after "
        "`import torch`");
  }
  absl::StatusOr<graphalloc::CachingAllocator*> allocator = graphalloc::DefaultAllocator(device);
  if (!allocator.ok()) throw std::runtime_error("graphalloc: " + allocator.status().ToString());
  allocator_ = *allocator;
  // The device's default generator always takes part: every PyTorch random op without a generator of its
  // own draws from it.
  generators_.push_back(
      std::make_unique<TorchGeneratorParticipant>(at::cuda::detail::getDefaultCUDAGenerator(device)));
  for (const at::Generator& g : options_.generators) {
    bool known = false;
    for (const auto& p : generators_) known = known || p->generator() == g;
    if (!known) generators_.push_back(std::make_unique<TorchGeneratorParticipant>(g));
  }
}

GraphFrontEnd::~GraphFrontEnd() {
  handed_out_.PoisonAll(
      "graphalloc: this tensor was an output of the CUDA graphs of '" + options_.name +
      "', which are gone, and it could not be kept (it was overwritten before, or the device "
      "had no memory for a copy when they went)");
}

void GraphFrontEnd::KeepHeldOutputs() noexcept {
  try {
    handed_out_.CopyOutOverwritten(device());
    handed_out_.CopyOutAllCurrent(device());
  } catch (const std::exception&) {
    // Whatever did not move is poisoned with the graphs (~GraphFrontEnd): a clear error, never stale data.
  }
}

graphalloc::Stream GraphFrontEnd::CallerStream() const {
  return graphalloc::StreamFromNative(c10::cuda::getCurrentCUDAStream(options_.device).stream());
}

std::vector<graphalloc::CaptureParticipant*> GraphFrontEnd::Participants() const {
  std::vector<graphalloc::CaptureParticipant*> out;
  for (const auto& p : generators_) out.push_back(p.get());
  return out;
}

graphalloc::TreeLogSink GraphFrontEnd::WarnInPython() {
  return [](graphalloc::TreeLogLevel level, std::string_view message) {
    if (level != graphalloc::TreeLogLevel::kWarning) return;
    pybind11::gil_scoped_acquire gil;
    try {
      pybind11::module_::import("warnings")
          .attr("warn")(std::string("graphalloc: ") + std::string(message),
                        pybind11::module_::import("builtins").attr("RuntimeWarning"), 2);
    } catch (pybind11::error_already_set& e) {
      e.discard_as_unraisable("graphalloc: a graph tree warning");
    }
  };
}

bool GraphFrontEnd::Capturing(graphalloc::Stream stream) const {
  c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
      static_cast<cudaStream_t>(graphalloc::NativeFromStream(stream)), options_.device));
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

absl::Status GraphFrontEnd::RunBody(graphalloc::Stream stream, const std::function<void()>& body) {
  try {
    c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(
        static_cast<cudaStream_t>(graphalloc::NativeFromStream(stream)), options_.device));
    body();
    return absl::OkStatus();
  } catch (pybind11::error_already_set& e) {
    const std::string what = e.what();
    body_error_ = std::make_unique<pybind11::error_already_set>(std::move(e));
    return absl::AbortedError(what);
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

void GraphFrontEnd::Raise(const absl::Status& status) {
  last_error_ = std::string(status.message());
  for (const at::Tensor& t : disowned_) Reown(t);
  disowned_.clear();
  if (body_error_ != nullptr) {
    std::unique_ptr<pybind11::error_already_set> error = std::move(body_error_);
    throw pybind11::error_already_set(std::move(*error));
  }
  throw std::runtime_error("graphalloc: " + last_error_);
}

}  // namespace graphalloc_torch
