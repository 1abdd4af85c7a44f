#include "graphalloc/graph/tree_dump.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/graph/graph_tree.h"

namespace graphalloc {

const TreeDumpNode* TreeDump::FindNode(std::uint64_t id) const {
  for (const TreeDumpNode& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

const TreeDumpSite* TreeDump::FindSite(std::uint64_t parent, std::uint32_t function) const {
  for (const TreeDumpSite& s : sites) {
    if (s.parent == parent && s.function == function) return &s;
  }
  return nullptr;
}

std::vector<const TreeDumpNode*> TreeDump::NodesOf(std::uint32_t function) const {
  std::vector<const TreeDumpNode*> out;
  for (const TreeDumpNode& n : nodes) {
    if (n.function == function) out.push_back(&n);
  }
  return out;
}

namespace {

TreeDumpSite DumpSite(const CallSite& site, std::uint64_t parent, std::string function_name) {
  TreeDumpSite ds;
  ds.parent = parent;
  ds.function = site.function;
  ds.function_name = std::move(function_name);
  ds.recordings = site.nodes.size();
  ds.rerecords = site.rerecords;
  ds.reasons = site.reasons;
  ds.failed_recordings = site.failed_recordings;
  ds.eager = site.eager;
  ds.eager_calls = site.eager_calls;
  ds.eager_warning = site.eager_warning;
  ds.eager_node = site.eager_node != nullptr ? site.eager_node->id : 0;
  ds.executables = site.executables.size();
  ds.executable_counters = site.executables.counters();
  return ds;
}

TreeDumpNode DumpNode(const TreeNode& node, std::uint64_t parent, std::string function_name) {
  TreeDumpNode dn;
  dn.id = node.id;
  dn.parent = parent;
  dn.function = node.function;
  dn.function_name = std::move(function_name);
  dn.depth = node.depth;
  dn.inputs = node.key.inputs;
  for (const OutputSpec& o : node.outputs) dn.outputs.push_back(o.buffer);
  dn.reason = node.reason;
  dn.reason_detail = node.reason_detail;
  dn.replays = node.replays;
  dn.has_executable = node.exec.slot != ExecHolder::kNone;
  dn.checkpoint_segments = node.checkpoint.segments.size();
  for (const CheckpointSegment& s : node.checkpoint.segments) {
    for (const CheckpointBlock& b : s.blocks) dn.checkpoint_allocated_bytes += b.allocated ? b.size : 0;
  }
  dn.expected_dead = node.expected_dead.size();
  return dn;
}

}  // namespace

TreeDump GraphTree::Dump() const {
  TreeDump dump;
  dump.step = step();
  dump.pool = pool_.id();
  dump.counters = counters_;
  dump.counters.steps = dump.step;
  if (absl::StatusOr<PoolStats> stats = allocator_.GetPoolStats(pool_.id()); stats.ok()) {
    dump.pool_reserved_bytes = stats->reserved_bytes;
    dump.pool_allocated_bytes = stats->allocated_bytes;
  }
  for (std::size_t i = 0; i < functions_.size(); ++i) {
    const Function& f = functions_[i];
    dump.functions.push_back(TreeDumpFunction{static_cast<std::uint32_t>(i), f.options.name,
                                              f.options.static_inputs, f.options.warmup_calls,
                                              f.warmup_runs});
  }
  // Depth-first over sites; sites of one parent in function order, for a stable dump.
  auto visit = [&](auto& self,
                   const absl::flat_hash_map<FunctionId, std::unique_ptr<CallSite>>& sites) -> void {
    std::vector<const CallSite*> ordered;
    for (const auto& [fn, site] : sites) ordered.push_back(site.get());
    std::sort(ordered.begin(), ordered.end(),
              [](const CallSite* a, const CallSite* b) { return a->function < b->function; });
    for (const CallSite* site : ordered) {
      const std::string& name = functions_[site->function].options.name;
      const std::uint64_t parent = site->parent != nullptr ? site->parent->id : 0;
      dump.sites.push_back(DumpSite(*site, parent, name));
      for (const std::unique_ptr<TreeNode>& node : site->nodes) {
        dump.nodes.push_back(DumpNode(*node, parent, name));
        self(self, node->children);
      }
      if (site->eager_node != nullptr) self(self, site->eager_node->children);
    }
  };
  visit(visit, roots_);
  return dump;
}

std::string FormatTreeDump(const TreeDump& dump) {
  std::string out = absl::StrFormat(
      "graph tree: step %d, pool %d (%d bytes reserved, %d allocated); %d recordings (%d failed), %d "
      "replays, "
      "%d warmup runs, %d eager runs, %d checkpoint restores\n",
      dump.step, dump.pool, dump.pool_reserved_bytes, dump.pool_allocated_bytes, dump.counters.recordings,
      dump.counters.failed_recordings, dump.counters.replays, dump.counters.warmup_runs,
      dump.counters.eager_runs, dump.counters.checkpoint_restores);
  for (const TreeDumpNode& n : dump.nodes) {
    absl::StrAppend(&out, std::string(2 * (n.depth + 1), ' '),
                    absl::StrFormat("node %d '%s' (parent %d): %d replays%s; %s", n.id, n.function_name,
                                    n.parent, n.replays, n.has_executable ? "" : ", no executable now",
                                    n.reason == RerecordReason::kFirst ? std::string("first recording")
                                                                       : n.reason_detail));
    absl::StrAppend(&out, "; inputs [");
    for (std::size_t i = 0; i < n.inputs.size(); ++i) {
      const KeyInput& in = n.inputs[i];
      absl::StrAppend(&out, i == 0 ? "" : ", ", InputRoleName(in.role),
                      in.role == InputRole::kCopied ? "" : absl::StrFormat(" 0x%x", in.ptr), " ", in.bytes,
                      "B");
    }
    absl::StrAppend(&out, "]; outputs [");
    for (std::size_t i = 0; i < n.outputs.size(); ++i) {
      absl::StrAppend(&out, i == 0 ? "" : ", ",
                      absl::StrFormat("0x%x %dB", n.outputs[i].ptr, n.outputs[i].bytes));
    }
    absl::StrAppend(&out, "]\n");
  }
  for (const TreeDumpSite& s : dump.sites) {
    absl::StrAppend(&out, absl::StrFormat("  site (parent %d, '%s'): %d recordings, %d re-records", s.parent,
                                          s.function_name, s.recordings, s.rerecords));
    for (int r = 1; r < kRerecordReasonCount; ++r) {
      if (s.reasons[r] > 0) {
        absl::StrAppend(&out, absl::StrFormat(" [%s: %d]", RerecordReasonName(static_cast<RerecordReason>(r)),
                                              s.reasons[r]));
      }
    }
    absl::StrAppend(&out,
                    absl::StrFormat("; %d executables (%d instantiated, %d updated)", s.executables,
                                    s.executable_counters.instantiations, s.executable_counters.updates));
    if (s.failed_recordings > 0) absl::StrAppend(&out, absl::StrFormat("; %d failed", s.failed_recordings));
    if (s.eager) {
      absl::StrAppend(&out, absl::StrFormat("; EAGER (%d eager calls; later calls under node %d)",
                                            s.eager_calls, s.eager_node));
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace graphalloc
