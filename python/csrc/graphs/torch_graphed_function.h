// graphalloc.torch.graphed(fn): any function of tensors (a whole training step: forward, loss, backward,
// optimizer) recorded and replayed through a graph tree (graph/graph_tree.h), with the tree's rules.
//
// Python flattens a call into tensors: the static ones first (parameters, buffers, their gradients, named
// tensors: read in place, their addresses part of the recording key; an absent gradient is an undefined
// tensor), then the copied ones (the other tensor arguments), and a tag of the non-tensor arguments.
// Python's body runs the function on the tensors as the graph passes them and returns its outputs
// flattened. The tree warms up, records (the body inside a capture), replays (no body: tensors of the
// recorded shapes over the recording's outputs) or runs the body eagerly past its re-record limit.
#ifndef GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_FUNCTION_H_
#define GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_FUNCTION_H_

#include <ATen/Tensor.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "graphalloc/graph/graph_tree.h"
#include "python/csrc/graphs/torch_graph_front_end.h"
#include "python/csrc/graphs/torch_output_plan.h"

namespace graphalloc_torch {

class TorchGraphedFunction final : public GraphFrontEnd {
 public:
  // `body(tensors)`: runs the function on `tensors` (as the graph passes them, in Call's order) and
  // returns a list of its output tensors (None for none).
  TorchGraphedFunction(pybind11::function body, FrontEndOptions options);
  ~TorchGraphedFunction();

  // One call: `inputs` are the static tensors (the first `num_static`, the same count every call) then the
  // copied ones; `constants` tags the call's other arguments (0: none). Returns the outputs.
  std::vector<std::optional<at::Tensor>> Call(const std::vector<std::optional<at::Tensor>>& inputs,
                                              std::size_t num_static, std::uint64_t constants);

  // The tree, made by the first call (nullptr before it).
  const graphalloc::GraphTree* tree() const { return tree_.get(); }

 private:
  absl::StatusOr<std::vector<graphalloc::BufferView>> Body(std::span<const graphalloc::BufferView> in,
                                                           graphalloc::Stream stream);

  pybind11::function body_;
  std::unique_ptr<graphalloc::GraphTree> tree_;
  graphalloc::FunctionId function_ = 0;
  std::optional<std::size_t> num_static_;
  // The call under way (the tree runs the body synchronously).
  std::vector<at::Tensor> inputs_;
};

}  // namespace graphalloc_torch

#endif  // GRAPHALLOC_PYTHON_CSRC_GRAPHS_TORCH_GRAPHED_FUNCTION_H_
