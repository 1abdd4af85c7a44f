// GraphTree: warmup calls, recordings, and keeping the pool's layout right for both.
//
// The pool's allocator state is only meaningful right after a recording: replays write into the pool
// without telling the allocator. So before anything allocates in the pool (a warmup, a recording), the
// pool is restored to the checkpoint of the node the step is at (the empty pool for a root), and the
// outputs that were live in that checkpoint but have died since are freed, for the new work to reuse.
#include <algorithm>
#include <atomic>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/graph/input_mutation_check.h"
#include "graphalloc/rng/draw_guard.h"
#include "graphalloc/rng/generator.h"

namespace graphalloc {
namespace {

// Generator capture ids tag capture-relative generator states; unique in the process, so a state saved
// during one recording can never be restored during another (of this tree or any other).
std::atomic<std::uint64_t> next_rng_capture_id{1};

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Allocated blocks of a checkpoint, by address.
absl::flat_hash_set<DevicePtr> AllocatedBlocks(const PoolCheckpoint& checkpoint) {
  absl::flat_hash_set<DevicePtr> blocks;
  for (const CheckpointSegment& s : checkpoint.segments) {
    for (const CheckpointBlock& b : s.blocks) {
      if (b.allocated) blocks.insert(s.base + b.offset);
    }
  }
  return blocks;
}

}  // namespace

absl::Status GraphTree::JoinTreeToCaller(Stream caller) {
  if (absl::Status s = driver_.EventRecord(caller_ready_, caller); !s.ok()) return s;
  return driver_.StreamWaitEvent(stream_, caller_ready_);
}

absl::Status GraphTree::JoinCallerToTree(Stream caller) {
  if (absl::Status s = driver_.EventRecord(tree_done_, stream_); !s.ok()) return s;
  return driver_.StreamWaitEvent(caller, tree_done_);
}

absl::Status GraphTree::PrepareRngReplay(const TreeNode& node, Stream stream) {
  const std::vector<Generator*>& generators = functions_[node.function].options.generators;
  for (std::size_t i = 0; i < node.rng.size(); ++i) {
    if (absl::Status s = generators[i]->PrepareReplay(node.rng[i], stream); !s.ok()) {
      return Annotate(
          s, absl::StrFormat("graph tree: preparing generator %d for a launch of node %d", i, node.id));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolCheckpoint> GraphTree::CheckpointPool() {
  absl::StatusOr<PoolCheckpoint> checkpoint = allocator_.Checkpoint(pool_);
  if (!absl::IsFailedPrecondition(checkpoint.status())) return checkpoint;
  // Blocks freed after use on another stream (RecordStream) wait on events: EmptyPoolCache waits for them
  // and settles them (it releases nothing: the pool is pinned).
  if (absl::Status s = allocator_.EmptyPoolCache(pool_.id()); !s.ok()) return s;
  return allocator_.Checkpoint(pool_);
}

absl::Status GraphTree::PreparePoolFor(const TreeNode* parent) {
  // Eager calls allocate outside the pool: after an eager node the pool is its nearest recorded ancestor's.
  while (parent != nullptr && parent->eager) parent = parent->parent;
  if (!pool_layout_known_ || pool_layout_ != parent) {
    const PoolCheckpoint& target = parent != nullptr ? parent->checkpoint : empty_checkpoint_;
    absl::StatusOr<RestoreResult> restored = allocator_.Restore(pool_, target);
    if (absl::IsFailedPrecondition(restored.status())) {  // events pending, as in CheckpointPool
      if (absl::Status s = allocator_.EmptyPoolCache(pool_.id()); !s.ok()) return s;
      restored = allocator_.Restore(pool_, target);
    }
    if (!restored.ok()) {
      return Annotate(restored.status(),
                      absl::StrFormat("graph tree: restoring the pool to %s failed",
                                      parent != nullptr ? absl::StrFormat("node %d's checkpoint", parent->id)
                                                        : std::string("its empty layout")));
    }
    ++counters_.checkpoint_restores;
    pool_layout_ = parent;
    pool_layout_known_ = true;
  }
  if (parent == nullptr) return absl::OkStatus();
  for (const PathOutputRef& r : parent->live_after) {
    if (!path_[r.depth].outputs[r.index].expired()) continue;
    const DevicePtr ptr = path_[r.depth].node->outputs[r.index].buffer.ptr;
    pool_layout_known_ = false;
    if (absl::Status s = allocator_.Free(ptr); !s.ok()) {
      return Annotate(s, absl::StrFormat("graph tree: freeing dead output %d of node %d failed", r.index,
                                         path_[r.depth].node->id));
    }
    ++counters_.dead_outputs_freed;
  }
  return absl::OkStatus();
}

void GraphTree::FreeWarmupBlocks(bool all) {
  for (PathEntry& entry : path_) {
    auto keep = [&](const std::pair<std::uint32_t, DevicePtr>& block) {
      if (!all && !entry.outputs[block.first].expired()) return true;
      pool_layout_known_ = false;
      if (absl::Status s = allocator_.Free(block.second); !s.ok()) {
        Log(TreeLogLevel::kWarning,
            absl::StrCat("graph tree: freeing a warmup output failed: ", s.message()));
      }
      return false;
    };
    std::erase_if(entry.warmup_blocks, [&](const auto& block) { return !keep(block); });
  }
}

namespace {

// Whether `inner` lies within `outer` (an empty output at `outer`'s address counts).
bool Within(const BufferView& inner, const BufferView& outer) {
  if (inner.ptr == outer.ptr) return inner.bytes <= outer.bytes;
  return inner.ptr > outer.ptr && inner.ptr - outer.ptr < outer.bytes &&
         inner.bytes <= outer.bytes - (inner.ptr - outer.ptr);
}

}  // namespace

std::vector<OutputSpec> GraphTree::ClassifyOutputs(std::span<const BufferView> seen,
                                                   std::span<const BufferView> produced) {
  std::vector<OutputSpec> specs(produced.size());
  for (std::size_t j = 0; j < produced.size(); ++j) {
    OutputSpec& spec = specs[j];
    spec.buffer = produced[j];
    if (produced[j].ptr == 0) {
      spec.source = OutputSpec::Source::kEmpty;
      spec.buffer = BufferView{};
      continue;
    }
    // An earlier output first (so two outputs of one buffer share it), then the inputs.
    for (std::size_t k = 0; k < j && spec.source == OutputSpec::Source::kNew; ++k) {
      if (specs[k].source == OutputSpec::Source::kEmpty || !Within(produced[j], produced[k])) continue;
      spec.source = OutputSpec::Source::kSameAsOutput;
      spec.from = static_cast<std::uint32_t>(k);
      spec.offset = produced[j].ptr - produced[k].ptr;
    }
    for (std::size_t i = 0; i < seen.size() && spec.source == OutputSpec::Source::kNew; ++i) {
      if (seen[i].ptr == 0 || !Within(produced[j], seen[i])) continue;
      spec.source = OutputSpec::Source::kInput;
      spec.from = static_cast<std::uint32_t>(i);
      spec.offset = produced[j].ptr - seen[i].ptr;
    }
  }
  return specs;
}

// Every new output must be an allocated block of the pool: the tree frees it once it dies, and a replay
// writes it in place.
static absl::Status CheckOutputsInPool(std::string_view function, std::span<const OutputSpec> specs,
                                       const absl::flat_hash_set<DevicePtr>& allocated) {
  for (std::size_t j = 0; j < specs.size(); ++j) {
    if (specs[j].source != OutputSpec::Source::kNew || allocated.contains(specs[j].buffer.ptr)) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "output %d of '%s' (0x%x) is not a buffer the function allocated during the call (no allocation of "
        "the "
        "tree's pool starts there); return buffers allocated with the tree's allocator during the call, or "
        "inputs returned as they are",
        j, function, specs[j].buffer.ptr));
  }
  return absl::OkStatus();
}

std::vector<TreeOutput> GraphTree::MakeOutputs(const Function& fn, std::span<const OutputSpec> specs,
                                               std::span<const CallInput> inputs, OutputKind new_kind,
                                               bool recorded, PathEntry& entry) {
  const std::uint64_t now = step();
  std::vector<TreeOutput> outputs(specs.size());
  entry.outputs.resize(specs.size());
  for (std::size_t j = 0; j < specs.size(); ++j) {
    const OutputSpec& spec = specs[j];
    std::shared_ptr<OutputState> state;
    // An alias is the caller's buffer at the recorded offset (for a copied input, the caller's buffer,
    // not the graph's copy); it shares the state of the output it aliases, or is a view that holds it.
    BufferView alias;
    const std::shared_ptr<OutputState>* aliased = nullptr;
    if (spec.source == OutputSpec::Source::kSameAsOutput) {
      aliased = &outputs[spec.from].state();
      alias = BufferView{(*aliased)->buffer.ptr + spec.offset, spec.buffer.bytes};
    } else if (spec.source == OutputSpec::Source::kInput) {
      aliased = inputs[spec.from].handle();
      alias = BufferView{inputs[spec.from].view().ptr + spec.offset, spec.buffer.bytes};
    }
    if (aliased != nullptr && *aliased != nullptr) {
      state = MakeOutputView(*aliased, alias);
    } else {
      state = std::make_shared<OutputState>();
      state->index = static_cast<std::uint32_t>(j);
      state->origin = fn.origin;
      state->allocator = &allocator_;
      if (spec.source == OutputSpec::Source::kNew) {
        state->kind = new_kind;
        state->buffer = spec.buffer;
        state->step = now;
        state->recorded = recorded;
      } else {
        state->kind = OutputKind::kBorrowed;
        state->buffer = alias;
      }
    }
    entry.outputs[j] = state;
    outputs[j] = TreeOutput(std::move(state));
  }
  return outputs;
}

bool GraphTree::ChecksForMutation(const Function& fn, std::size_t i, const CallInput& input) const {
  if (!options_.check_input_mutation || input.view().bytes == 0) return false;
  if ((i < fn.is_static.size() && fn.is_static[i]) || (i < fn.is_mutated.size() && fn.is_mutated[i]))
    return false;
  // An output of this tree's pool is read in place by a recording (a managed input): a write lands where
  // the caller sees it.
  const OutputState* out = input.output();
  return out == nullptr || out->kind != OutputKind::kPool || out->origin->tree != this;
}

absl::Status GraphTree::CheckWarmupMutation(Function& fn, InputMutationCheck& check) {
  if (absl::Status s = driver_.StreamSynchronize(stream_); !s.ok()) return s;
  absl::StatusOr<std::optional<std::size_t>> changed = check.FirstChanged();
  if (!changed.ok()) return changed.status();
  if (!changed->has_value()) return absl::OkStatus();
  fn.runs_eagerly = true;
  fn.eager_warning = absl::StrFormat(
      "graph tree: function '%s' wrote its input %d, a copied input it did not declare in "
      "FunctionOptions::mutated_inputs (found by comparing the input before and after a warmup call); a "
      "recording would write the graph's private copy and the caller's buffer would stop changing, so it "
      "runs eagerly from now on. Declare the input in mutated_inputs (or make it static) to record it",
      fn.options.name, **changed);
  Log(TreeLogLevel::kWarning, fn.eager_warning);
  return absl::OkStatus();
}

absl::Status GraphTree::WriteBack(const TreeNode& node, std::span<const CallInput> inputs, Stream stream) {
  for (const auto& [index, buffer] : node.write_backs) {
    const BufferView& dst = inputs[index].view();
    if (absl::Status s = driver_.CopyAsync(dst.ptr, buffer, dst.bytes, stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Warmup(FunctionId id, std::span<const CallInput> inputs,
                                                          Stream stream) {
  Function& fn = functions_[id];
  if (in_warmup_) {
    FreeWarmupBlocks(/*all=*/false);
  } else if (absl::Status s = PreparePoolFor(current_); !s.ok()) {
    return s;
  }
  if (absl::Status s = JoinTreeToCaller(stream); !s.ok()) return s;
  scratch_views_.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) scratch_views_[i] = inputs[i].view();
  InputMutationCheck mutation_check(driver_);
  bool check_mutation = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!ChecksForMutation(fn, i, inputs[i])) continue;
    if (!check_mutation) {
      if (absl::Status s = driver_.StreamSynchronize(stream); !s.ok()) return s;
      check_mutation = true;
    }
    if (absl::Status s = mutation_check.Before(i, inputs[i].view()); !s.ok()) return s;
  }

  absl::StatusOr<PoolRoute> route =
      allocator_.BeginAllocateToPool(pool_, PoolRouteFilter::ForCallingThread());
  if (!route.ok()) return route.status();
  pool_layout_known_ = false;  // the function allocates in the pool from here on
  absl::StatusOr<std::vector<BufferView>> produced = fn.body(scratch_views_, stream_);
  const absl::Status ended = route->End();
  if (!produced.ok()) {
    return Annotate(produced.status(),
                    absl::StrFormat("graph tree: warmup call of '%s' failed", fn.options.name));
  }
  if (!ended.ok()) return ended;
  const std::vector<OutputSpec> specs_now = ClassifyOutputs(scratch_views_, *produced);
  const std::vector<OutputSpec>* specs = &specs_now;
  absl::Status valid = absl::OkStatus();
  {
    absl::StatusOr<PoolCheckpoint> layout = CheckpointPool();
    valid =
        layout.ok() ? CheckOutputsInPool(fn.options.name, *specs, AllocatedBlocks(*layout)) : layout.status();
  }
  if (absl::Status s = JoinCallerToTree(stream); !s.ok() && valid.ok()) valid = s;
  if (valid.ok() && check_mutation) valid = CheckWarmupMutation(fn, mutation_check);
  if (!valid.ok()) return valid;  // what it allocated stays in the pool until the next restore frees it

  ++fn.warmup_runs;
  ++counters_.warmup_runs;
  in_warmup_ = true;
  PathEntry& entry = path_.emplace_back();
  entry.function = id;
  std::vector<TreeOutput> outputs =
      MakeOutputs(fn, *specs, inputs, OutputKind::kPool, /*recorded=*/false, entry);
  for (std::size_t j = 0; j < specs->size(); ++j) {
    if ((*specs)[j].source == OutputSpec::Source::kNew) {
      entry.warmup_blocks.emplace_back(static_cast<std::uint32_t>(j), (*specs)[j].buffer.ptr);
    }
  }
  return MaybeClone(fn, std::move(outputs), stream);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Record(CallSite& site, std::span<const CallInput> inputs,
                                                          Stream stream, const KeyMismatch& why) {
  Function& fn = functions_[site.function];
  TreeNode* const parent = site.parent;
  if (absl::Status s = PreparePoolFor(parent); !s.ok()) return s;
  if (absl::Status s = JoinTreeToCaller(stream); !s.ok()) return s;

  auto node = std::make_unique<TreeNode>();
  node->id = next_node_id_;
  node->function = site.function;
  node->parent = parent;
  node->site = &site;
  node->depth = static_cast<std::uint32_t>(path_.size());
  node->key = scratch_key_;
  node->reason = why.reason;
  if (why.reason != RerecordReason::kFirst) node->reason_detail = DescribeMismatch(why);

  // On any failure: nothing of the attempt stays. The function may have allocated in the pool, so the pool
  // goes back to the parent's layout.
  auto fail = [&](const absl::Status& error) -> absl::Status {
    site.executables.Release(node->exec);
    node.reset();
    ++site.failed_recordings;
    ++counters_.failed_recordings;
    pool_layout_known_ = false;
    std::string message =
        absl::StrFormat("graph tree: recording '%s' failed: %s", fn.options.name, error.message());
    // Restoring may unmap memory that queued copies still write: let them finish first.
    absl::Status cleanup = driver_.StreamSynchronize(stream_);
    if (cleanup.ok()) cleanup = PreparePoolFor(parent);
    if (!cleanup.ok())
      absl::StrAppend(&message, " (and putting the pool back failed: ", cleanup.message(), ")");
    return absl::Status(error.code(), message);
  };

  // The graph's own buffers for copied inputs, filled now: a capture records, it does not run.
  scratch_views_.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) scratch_views_[i] = inputs[i].view();
  {
    absl::StatusOr<PoolRoute> route =
        allocator_.BeginAllocateToPool(pool_, PoolRouteFilter::ForStream(stream_));
    if (!route.ok()) return fail(route.status());
    pool_layout_known_ = false;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const BufferView& src = inputs[i].view();
      if (scratch_key_.inputs[i].role != InputRole::kCopied || src.bytes == 0) continue;
      absl::StatusOr<DevicePtr> buffer = allocator_.Allocate(src.bytes, stream_);
      if (!buffer.ok()) return fail(buffer.status());
      node->copies.emplace_back(static_cast<std::uint32_t>(i), *buffer);
      if (i < fn.is_mutated.size() && fn.is_mutated[i])
        node->write_backs.emplace_back(static_cast<std::uint32_t>(i), *buffer);
      if (absl::Status s = driver_.CopyAsync(*buffer, src.ptr, src.bytes, stream_); !s.ok()) return fail(s);
      scratch_views_[i] = BufferView{*buffer, src.bytes};
    }
    if (absl::Status s = route->End(); !s.ok()) return fail(s);
  }

  // The generators' captures begin before the stream capture (each allocates its replay slots, which a
  // capture forbids) and end right after it, whatever happened, so no generator stays in capture mode.
  const std::uint64_t rng_capture_id = next_rng_capture_id.fetch_add(1, std::memory_order_relaxed);
  std::size_t rng_begun = 0;
  auto cancel_rng = [&] {
    for (std::size_t i = 0; i < rng_begun; ++i) (void)fn.options.generators[i]->CancelCapture();
  };
  for (Generator* generator : fn.options.generators) {
    if (absl::Status s = generator->BeginCapture(rng_capture_id); !s.ok()) {
      cancel_rng();
      return fail(s);
    }
    ++rng_begun;
  }
  std::vector<BufferView> produced;
  absl::StatusOr<OwnedGraph> graph = CaptureIntoPool(
      allocator_, pool_, stream_,
      [&](Stream s) -> absl::Status {
        const DrawGuard unregistered_draws(fn.options.name);
        absl::StatusOr<std::vector<BufferView>> out = fn.body(scratch_views_, s);
        if (!out.ok()) return out.status();
        produced = std::move(*out);
        return absl::OkStatus();
      },
      options_.capture);
  if (!graph.ok()) {
    cancel_rng();
    return fail(graph.status());
  }
  for (std::size_t i = 0; i < rng_begun; ++i) {
    absl::StatusOr<CapturedRng> captured = fn.options.generators[i]->EndCapture();
    if (!captured.ok()) {
      for (std::size_t k = i + 1; k < rng_begun; ++k) (void)fn.options.generators[k]->CancelCapture();
      return fail(captured.status());
    }
    node->rng.push_back(std::move(*captured));
  }
  node->graph = std::move(*graph);
  node->outputs = ClassifyOutputs(scratch_views_, produced);

  // The copy buffers are dead once the launch that follows each copy has read them: free, so the pool can
  // lend them to later calls of the step (the next copy into them comes with this node's next replay).
  for (const auto& [index, buffer] : node->copies) {
    if (absl::Status s = allocator_.Free(buffer); !s.ok()) return fail(s);
  }
  absl::StatusOr<PoolCheckpoint> checkpoint = CheckpointPool();
  if (!checkpoint.ok()) return fail(checkpoint.status());
  node->checkpoint = std::move(*checkpoint);
  const absl::flat_hash_set<DevicePtr> allocated = AllocatedBlocks(node->checkpoint);
  if (absl::Status s = CheckOutputsInPool(fn.options.name, node->outputs, allocated); !s.ok()) return fail(s);

  absl::StatusOr<GraphExec> exec = site.executables.Acquire(node->exec, node->graph);
  if (!exec.ok()) return fail(exec.status());
  if (absl::Status s = PrepareRngReplay(*node, stream_); !s.ok()) return fail(s);
  if (absl::Status s = driver_.GraphLaunch(*exec, stream_); !s.ok()) return fail(s);
  launched_ = true;
  if (absl::Status s = WriteBack(*node, inputs, stream_); !s.ok()) return fail(s);
  if (absl::Status s = JoinCallerToTree(stream); !s.ok()) return fail(s);

  // Liveness: what this recording may overwrite (the dead outputs of the path) and what its checkpoint
  // holds (the live ones, and its own new outputs).
  for (std::uint32_t d = 0; d < path_.size(); ++d) {
    const PathEntry& e = path_[d];
    for (std::uint32_t i = 0; i < e.outputs.size(); ++i) {
      if (e.node == nullptr || e.eager || e.node->outputs[i].source != OutputSpec::Source::kNew) continue;
      (e.outputs[i].expired() ? node->expected_dead : node->live_after).push_back(PathOutputRef{d, i});
    }
  }
  for (std::uint32_t j = 0; j < node->outputs.size(); ++j) {
    if (node->outputs[j].source == OutputSpec::Source::kNew) node->live_after.push_back({node->depth, j});
  }
  if (allocated.size() > node->live_after.size()) {
    Log(TreeLogLevel::kWarning,
        absl::StrFormat("graph tree: recording '%s' left %d allocations in the pool that it did not return; "
                        "they stay allocated for as long as the recording lives (free temporaries during the "
                        "call)",
                        fn.options.name, allocated.size() - node->live_after.size()));
  }

  ++next_node_id_;
  ++counters_.recordings;
  if (why.reason != RerecordReason::kFirst) {
    ++site.rerecords;
    ++site.reasons[static_cast<int>(why.reason)];
  }
  Log(TreeLogLevel::kInfo,
      absl::StrFormat("graph tree: recorded '%s' as node %d (%s)", fn.options.name, node->id,
                      why.reason == RerecordReason::kFirst ? "first recording" : node->reason_detail));
  pool_layout_ = node.get();
  pool_layout_known_ = true;
  TreeNode& added = *node;
  site.by_key[added.key.hash].push_back(&added);
  site.nodes.push_back(std::move(node));
  return FinishRecordedCall(added, inputs, stream);
}

}  // namespace graphalloc
