// graphalloc._torch_graphs: the Python module of graphalloc's PyTorch graph front ends
// (python/graphalloc/torch_graphs.py is their user-facing side). Built against the PyTorch and Python
// that will import it; it links libgraphalloc.so, so it shares the process's allocators with the PyTorch
// backend (libgraphalloc_torch.so), which must be PyTorch's allocator.
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/empty_like.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "graphalloc/graph/tree_dump.h"
#include "python/csrc/graphs/torch_graphed_callables.h"
#include "python/csrc/graphs/torch_graphed_function.h"

namespace graphalloc_torch {
namespace {

namespace py = pybind11;

const char* KindName(graphalloc::TreeCallInfo::Kind kind) {
  switch (kind) {
    case graphalloc::TreeCallInfo::Kind::kWarmup:
      return "warmup";
    case graphalloc::TreeCallInfo::Kind::kRecord:
      return "record";
    case graphalloc::TreeCallInfo::Kind::kReplay:
      return "replay";
    case graphalloc::TreeCallInfo::Kind::kEager:
      return "eager";
  }
  return "?";
}

// A tree's structure, counters and memory, as plain Python data.
py::dict DumpOf(const graphalloc::GraphTree& tree) {
  const graphalloc::TreeDump d = tree.Dump();
  py::dict out;
  out["step"] = d.step;
  out["pool"] = d.pool;
  out["pool_reserved_bytes"] = d.pool_reserved_bytes;
  out["pool_allocated_bytes"] = d.pool_allocated_bytes;
  py::dict counters;
  counters["warmup_runs"] = d.counters.warmup_runs;
  counters["recordings"] = d.counters.recordings;
  counters["failed_recordings"] = d.counters.failed_recordings;
  counters["replays"] = d.counters.replays;
  counters["eager_runs"] = d.counters.eager_runs;
  counters["checkpoint_restores"] = d.counters.checkpoint_restores;
  out["counters"] = counters;
  py::list nodes;
  for (const graphalloc::TreeDumpNode& n : d.nodes) {
    py::dict node;
    node["id"] = n.id;
    node["parent"] = n.parent;
    node["function"] = n.function_name;
    node["depth"] = n.depth;
    node["reason"] = graphalloc::RerecordReasonName(n.reason);
    node["reason_detail"] = n.reason_detail;
    node["replays"] = n.replays;
    node["allocated_bytes"] = n.checkpoint_allocated_bytes;
    nodes.append(node);
  }
  out["nodes"] = nodes;
  py::list sites;
  for (const graphalloc::TreeDumpSite& s : d.sites) {
    py::dict site;
    site["function"] = s.function_name;
    site["recordings"] = s.recordings;
    site["rerecords"] = s.rerecords;
    site["failed_recordings"] = s.failed_recordings;
    site["eager"] = s.eager;
    site["eager_calls"] = s.eager_calls;
    site["eager_warning"] = s.eager_warning;
    sites.append(site);
  }
  out["sites"] = sites;
  out["last_call"] = KindName(tree.last_call().kind);
  out["recording_disabled"] = tree.recording_disabled();
  out["disabled_reason"] = tree.disabled_reason();
  out["text"] = graphalloc::FormatTreeDump(d);
  return out;
}

}  // namespace
}  // namespace graphalloc_torch

PYBIND11_MODULE(_torch_graphs, m) {
  using namespace graphalloc_torch;  // NOLINT(google-build-using-namespace): the bindings name its types
  namespace py = pybind11;
  m.doc() = "graphalloc's PyTorch graph front ends (use graphalloc.torch.graphed / make_graphed_callables)";

  // Owned copies of gradients in one multi-tensor copy (what a replay's aliased gradients become when
  // PyTorch would keep them: a parameter without .grad, or a hook holding them).
  m.def(
      "clone_all",
      [](const std::vector<at::Tensor>& sources) {
        std::vector<at::Tensor> copies;
        copies.reserve(sources.size());
        for (const at::Tensor& t : sources) copies.push_back(at::empty_like(t));
        at::_foreach_copy_(copies, sources);
        return copies;
      },
      py::arg("sources"));

  py::class_<TorchGraphedFunction>(m, "GraphedFunction")
      .def(py::init([](py::function body, std::string name, int device, int max_recordings, int warmup_calls,
                       std::vector<at::Generator> generators) {
             return new TorchGraphedFunction(
                 std::move(body), FrontEndOptions{std::move(name), static_cast<c10::DeviceIndex>(device),
                                                  max_recordings, warmup_calls, std::move(generators)});
           }),
           py::arg("body"), py::arg("name"), py::arg("device"), py::arg("max_recordings"),
           py::arg("warmup_calls"), py::arg("generators"))
      .def("call", &TorchGraphedFunction::Call, py::arg("inputs"), py::arg("num_static"),
           py::arg("constants"))
      .def("dump",
           [](const TorchGraphedFunction& f) { return f.tree() != nullptr ? DumpOf(*f.tree()) : py::dict(); })
      .def_property_readonly("last_call",
                             [](const TorchGraphedFunction& f) {
                               if (f.tree() == nullptr) return py::make_tuple("none", 0);
                               const graphalloc::TreeCallInfo& info = f.tree()->last_call();
                               return py::make_tuple(KindName(info.kind), info.node);
                             })
      .def_property_readonly("last_error", &TorchGraphedFunction::last_error);

  py::class_<TorchGraphedCallables>(m, "GraphedCallables")
      .def(py::init([](py::list stages, std::string name, int device, std::size_t max_outstanding_forwards,
                       int max_recordings, int warmup_calls, std::vector<at::Generator> generators) {
             std::vector<GraphedStage> specs;
             for (py::handle h : stages) {
               py::dict d = py::reinterpret_borrow<py::dict>(h);
               GraphedStage stage;
               stage.name = d["name"].cast<std::string>();
               stage.num_inputs = d["num_inputs"].cast<std::size_t>();
               stage.num_params = d["num_params"].cast<std::size_t>();
               stage.forward = d["forward"].cast<py::function>();
               stage.backward = d["backward"].cast<py::function>();
               stage.owned_slots = d["owned_slots"].cast<std::vector<bool>>();
               specs.push_back(std::move(stage));
             }
             GraphedCallablesOptions options;
             options.name = std::move(name);
             options.device = static_cast<c10::DeviceIndex>(device);
             options.max_recordings = max_recordings;
             options.warmup_calls = warmup_calls;
             options.generators = std::move(generators);
             options.max_outstanding_forwards = max_outstanding_forwards;
             return new TorchGraphedCallables(std::move(specs), std::move(options));
           }),
           py::arg("stages"), py::arg("name"), py::arg("device"), py::arg("max_outstanding_forwards"),
           py::arg("max_recordings"), py::arg("warmup_calls"), py::arg("generators"))
      .def(
          "forward",
          [](TorchGraphedCallables& c, std::size_t stage,
             const std::vector<std::optional<at::Tensor>>& inputs, const std::vector<at::Tensor>& params) {
            TorchGraphedCallables::ForwardCall call = c.Forward(stage, inputs, params);
            // With the forward's release sentinel and the forwards that ended meanwhile: one call per
            // forward.
            return py::make_tuple(py::cast(call.outputs), call.id, call.lane, call.node,
                                  c.ReleaseSentinel(call.id), c.TakeEndedForwards());
          },
          py::arg("stage"), py::arg("inputs"), py::arg("params"))
      .def("backward", &TorchGraphedCallables::Backward, py::arg("forward_id"), py::arg("grad_outputs"))
      .def("release_sentinel", &TorchGraphedCallables::ReleaseSentinel, py::arg("forward_id"))
      .def("discard", &TorchGraphedCallables::Discard, py::arg("forward_id"))
      .def("take_ended_forwards", &TorchGraphedCallables::TakeEndedForwards)
      .def("node_of", &TorchGraphedCallables::NodeOf, py::arg("forward_id"))
      .def("request_release", &TorchGraphedCallables::RequestRelease, py::arg("what"), py::arg("release"))
      .def("dump",
           [](const TorchGraphedCallables& c) {
             py::list lanes;
             for (std::size_t i = 0; i < c.step().lanes(); ++i) {
               if (const graphalloc::GraphTree* tree = c.step().tree(i)) lanes.append(DumpOf(*tree));
             }
             py::dict out;
             out["lanes"] = lanes;
             out["pending_forwards"] = c.step().pending_forwards();
             out["deferred_releases"] = c.step().deferred_release_names();
             out["saved_bytes"] = c.step().saved_bytes();
             out["live_pool_bytes"] = c.step().live_pool_bytes();
             return out;
           })
      .def_property_readonly("last_error", &TorchGraphedCallables::last_error);
}
