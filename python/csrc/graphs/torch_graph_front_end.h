// What graphalloc's PyTorch graph front ends (torch_graphed_function.h, torch_graphed_callables.h) share:
// the device and its graphalloc allocator (PyTorch's, once graphalloc.torch.install() ran), PyTorch's CUDA
// generators as capture participants, the tensors handed out over pool outputs, and running Python
// bodies from inside the C++ graph layers.
//
// A Python body is called by the tree (a warmup, a recording, an eager call) with the GIL held, on the
// stream the tree gives it (made PyTorch's current stream for the call). A Python exception it raises is
// kept and the tree sees an error; once the tree has cleaned up (the capture ended, the pool put back),
// the front end raises the kept exception itself, with the tree's words as a note.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPH_FRONT_END_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPH_FRONT_END_H_

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/graph/capture_participant.h"
#include "graphalloc/graph/graph_tree.h"
#include "python/csrc/graphs/torch_generator_participant.h"
#include "python/csrc/graphs/torch_output_plan.h"
#include "python/csrc/graphs/torch_tensor_buffers.h"

namespace graphalloc_torch {

// What every front end is made with.
struct FrontEndOptions {
  std::string name = "graphed";
  c10::DeviceIndex device = 0;
  int max_recordings = 5;                 // re-records per place in a tree (TreeOptions::max_recordings)
  int warmup_calls = 1;                   // eager calls of each function before its first recording
  std::vector<at::Generator> generators;  // CUDA generators besides the device's default one
};

class GraphFrontEnd {
 public:
  // The message of the error that ended the last failed call (the tree's words), or empty.
  const std::string& last_error() const { return last_error_; }

 protected:
  // Throws std::runtime_error when graphalloc is not the device's allocator.
  explicit GraphFrontEnd(const FrontEndOptions& options);
  ~GraphFrontEnd();

  graphalloc::CachingAllocator& allocator() const { return *allocator_; }
  c10::DeviceIndex device() const { return options_.device; }
  const std::string& name() const { return options_.name; }
  const FrontEndOptions& options() const { return options_; }
  // PyTorch's current stream of the device, as the tree's Stream.
  graphalloc::Stream CallerStream() const;
  std::vector<graphalloc::CaptureParticipant*> Participants() const;
  // The trees' warnings (an eager fallback, a recording that kept memory) as Python RuntimeWarnings.
  static graphalloc::TreeLogSink WarnInPython();
  // Whether `stream` is capturing now (the body runs inside a recording).
  bool Capturing(graphalloc::Stream stream) const;

  // Runs `body` with `stream` as PyTorch's current stream; a Python (or C++) exception it throws is kept
  // and returned as an error.
  absl::Status RunBody(graphalloc::Stream stream, const std::function<void()>& body);
  // After a call failed with `status`: raises the body's kept exception, or RuntimeError with `status`.
  [[noreturn]] void Raise(const absl::Status& status);

  // Before the graphs go (a derived destructor, while its tree lives): every output the caller still holds
  // moves to memory of its own with its values, owned gradients of earlier micro-batches too. What cannot
  // move (an allocation failed) is poisoned by ~GraphFrontEnd.
  void KeepHeldOutputs() noexcept;

  HandedOut handed_out_;
  CallOutputs calls_;
  // What the call under way disowned (a recording's outputs and saved tensors): owned by PyTorch again if
  // the call fails (Raise), forgotten once it succeeds (Succeeded).
  std::vector<at::Tensor> disowned_;
  void Succeeded() { disowned_.clear(); }

 private:
  FrontEndOptions options_;
  graphalloc::CachingAllocator* allocator_ = nullptr;
  std::vector<std::unique_ptr<TorchGeneratorParticipant>> generators_;
  std::unique_ptr<pybind11::error_already_set> body_error_;
  std::string last_error_;
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPH_FRONT_END_H_
