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
#include "graphalloc/allocator/base/status_macros.h"
#include "graphalloc/graph/capture_participant.h"
#include "graphalloc/graph/graph_tree.h"
#include "graphalloc/graph/input_mutation_check.h"

namespace graphalloc {
namespace {

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

absl::StatusOr<bool> GraphTree::TakeInputsBeforeWarmup(const Function& fn, std::span<const CallInput> inputs,
                                                       Stream stream, InputMutationCheck& check) {
  bool checking = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!ChecksForMutation(fn, i, inputs[i])) continue;
    if (!checking) {
      GRAPHALLOC_RETURN_IF_ERROR(driver_.StreamSynchronize(stream));
      checking = true;
    }
    GRAPHALLOC_RETURN_IF_ERROR(check.Before(i, inputs[i].view()));
  }
  return checking;
}

absl::StatusOr<std::vector<BufferView>> GraphTree::RunInPool(const Function& fn) {
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
  return produced;
}

std::vector<TreeOutput> GraphTree::AddWarmupCall(FunctionId id, std::span<const OutputSpec> specs,
                                                 std::span<const CallInput> inputs) {
  Function& fn = functions_[id];
  ++fn.warmup_runs;
  ++counters_.warmup_runs;
  in_warmup_ = true;
  PathEntry& entry = path_.emplace_back();
  entry.function = id;
  std::vector<TreeOutput> outputs =
      MakeOutputs(fn, specs, inputs, OutputKind::kPool, /*recorded=*/false, entry);
  for (std::size_t j = 0; j < specs.size(); ++j) {
    if (specs[j].source == OutputSpec::Source::kNew) {
      entry.warmup_blocks.emplace_back(static_cast<std::uint32_t>(j), specs[j].buffer.ptr);
    }
  }
  return outputs;
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Warmup(FunctionId id, std::span<const CallInput> inputs,
                                                          Stream stream) {
  if (!options_.warmup_in_pool) return WarmupOutsidePool(id, inputs, stream);
  Function& fn = functions_[id];
  if (in_warmup_) {
    FreeWarmupBlocks(/*all=*/false);
  } else {
    GRAPHALLOC_RETURN_IF_ERROR(PreparePoolFor(current_));
  }
  GRAPHALLOC_RETURN_IF_ERROR(JoinTreeToCaller(stream));
  ViewInputs(inputs);
  InputMutationCheck mutation_check(driver_);
  GRAPHALLOC_ASSIGN_OR_RETURN(const bool check_mutation,
                              TakeInputsBeforeWarmup(fn, inputs, stream, mutation_check));
  GRAPHALLOC_ASSIGN_OR_RETURN(const std::vector<BufferView> produced, RunInPool(fn));

  const std::vector<OutputSpec> specs = ClassifyOutputs(scratch_views_, produced);
  absl::StatusOr<PoolCheckpoint> layout = CheckpointPool();
  absl::Status valid =
      layout.ok() ? CheckOutputsInPool(fn.options.name, specs, AllocatedBlocks(*layout)) : layout.status();
  if (absl::Status s = JoinCallerToTree(stream); !s.ok() && valid.ok()) valid = s;
  if (valid.ok() && check_mutation) valid = CheckWarmupMutation(fn, mutation_check);
  if (!valid.ok()) return valid;  // what it allocated stays in the pool until the next restore frees it
  last_call_ = TreeCallInfo{TreeCallInfo::Kind::kWarmup, 0};
  return MaybeClone(fn, AddWarmupCall(id, specs, inputs), stream);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::WarmupOutsidePool(FunctionId id,
                                                                     std::span<const CallInput> inputs,
                                                                     Stream stream) {
  Function& fn = functions_[id];
  GRAPHALLOC_RETURN_IF_ERROR(JoinTreeToCaller(stream));
  ViewInputs(inputs);
  InputMutationCheck mutation_check(driver_);
  GRAPHALLOC_ASSIGN_OR_RETURN(const bool check_mutation,
                              TakeInputsBeforeWarmup(fn, inputs, stream, mutation_check));
  absl::StatusOr<std::vector<BufferView>> produced = fn.body(scratch_views_, stream_);
  absl::Status joined = JoinCallerToTree(stream);
  if (!produced.ok()) {
    return Annotate(produced.status(),
                    absl::StrFormat("graph tree: warmup call of '%s' failed", fn.options.name));
  }
  // New outputs are the caller's from here on, as an eager call's are.
  const std::vector<OutputSpec> specs = ClassifyOutputs(scratch_views_, *produced);
  ++fn.warmup_runs;
  ++counters_.warmup_runs;
  in_warmup_ = true;
  PathEntry& entry = path_.emplace_back();
  entry.function = id;
  std::vector<TreeOutput> outputs = MakeOutputs(
      fn, specs, inputs, options_.eager_outputs_owned ? OutputKind::kOwned : OutputKind::kBorrowed,
      /*recorded=*/false, entry);
  if (joined.ok() && check_mutation) joined = CheckWarmupMutation(fn, mutation_check);
  if (!joined.ok()) return joined;
  last_call_ = TreeCallInfo{TreeCallInfo::Kind::kWarmup, 0};
  return MaybeClone(fn, std::move(outputs), stream);
}

// ---- Recording: Record and its steps, in the order it takes them. ----

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Record(CallSite& site, std::span<const CallInput> inputs,
                                                          Stream stream, const KeyMismatch& why) {
  const Function& fn = functions_[site.function];
  GRAPHALLOC_RETURN_IF_ERROR(PreparePoolFor(site.parent));
  if (options_.release_cache_before_recording) {
    // Only unused cached memory goes (the pool is pinned); a failure leaves the cache as it was.
    if (absl::Status s = allocator_.EmptyCache(); !s.ok()) {
      Log(TreeLogLevel::kInfo,
          absl::StrCat("graph tree: releasing the cache before recording: ", s.message()));
    }
  }
  GRAPHALLOC_RETURN_IF_ERROR(JoinTreeToCaller(stream));
  std::unique_ptr<TreeNode> node = NewNode(site, why);
  absl::flat_hash_set<DevicePtr> before;
  if (options_.stop_recording_after_failure) {
    GRAPHALLOC_ASSIGN_OR_RETURN(const PoolCheckpoint layout, CheckpointPool());
    before = AllocatedBlocks(layout);
  }
  absl::StatusOr<std::size_t> allocated = RecordNode(fn, *node, inputs, stream);
  if (!allocated.ok()) {
    if (options_.stop_recording_after_failure) {
      return StopRecordingAfter(site, std::move(node), fn, allocated.status(), before);
    }
    return FailRecording(site, std::move(node), fn, allocated.status());
  }
  NoteLiveness(*node);
  GRAPHALLOC_RETURN_IF_ERROR(CheckLeftovers(fn, site, node, *allocated));
  TreeNode& added = AddRecording(site, std::move(node), why, *allocated);
  last_call_ = TreeCallInfo{TreeCallInfo::Kind::kRecord, added.id};
  return FinishRecordedCall(added, inputs, stream);
}

absl::Status GraphTree::CheckLeftovers(const Function& fn, CallSite& site, std::unique_ptr<TreeNode>& node,
                                       std::size_t allocated) {
  if (!options_.fail_on_leftover_allocations || allocated <= node->live_after.size()) return absl::OkStatus();
  // The kept blocks: allocated in the checkpoint, and not an output of the path that is live.
  absl::flat_hash_set<DevicePtr> live;
  for (const PathOutputRef& r : node->live_after) {
    live.insert(r.depth == node->depth ? node->outputs[r.index].buffer.ptr
                                       : path_[r.depth].node->outputs[r.index].buffer.ptr);
  }
  std::size_t kept = 0, kept_bytes = 0;
  for (const CheckpointSegment& seg : node->checkpoint.segments) {
    for (const CheckpointBlock& b : seg.blocks) {
      if (!b.allocated || live.contains(seg.base + b.offset)) continue;
      ++kept;
      kept_bytes += b.size;
      kept_blocks_.insert(seg.base + b.offset);
    }
  }
  disabled_reason_ = absl::StrFormat(
      "recording '%s' kept %d allocation(s) (%d bytes) in the graph pool that it did not return: state the "
      "function created while it was captured (a cache, a module attribute, a lazily built buffer, a .grad "
      "made during the capture). Later replays would overwrite that memory, so the tree records nothing "
      "from now on and every call runs eagerly. Create such state before graphing (one eager call does it), "
      "or return it from the function",
      fn.options.name, kept, kept_bytes);
  Log(TreeLogLevel::kWarning, absl::StrCat("graph tree: ", disabled_reason_));
  // The node goes, its graph with it; the pool stays as it is (its kept blocks belong to their holders).
  site.executables.Release(node->exec);
  node.reset();
  ++site.failed_recordings;
  ++counters_.failed_recordings;
  pool_layout_known_ = false;
  return absl::FailedPreconditionError(absl::StrCat("graph tree: ", disabled_reason_));
}

absl::StatusOr<std::size_t> GraphTree::RecordNode(const Function& fn, TreeNode& node,
                                                  std::span<const CallInput> inputs, Stream stream) {
  GRAPHALLOC_RETURN_IF_ERROR(StageCopiedInputs(fn, node, inputs));
  GRAPHALLOC_RETURN_IF_ERROR(CaptureBody(fn, node));
  GRAPHALLOC_ASSIGN_OR_RETURN(const std::size_t allocated, CheckpointRecording(fn, node));
  GRAPHALLOC_RETURN_IF_ERROR(LaunchNode(node, inputs, stream_));  // the recording's own launch
  GRAPHALLOC_RETURN_IF_ERROR(JoinCallerToTree(stream));
  return allocated;
}

std::unique_ptr<TreeNode> GraphTree::NewNode(CallSite& site, const KeyMismatch& why) const {
  auto node = std::make_unique<TreeNode>();
  node->id = next_node_id_;
  node->function = site.function;
  node->parent = site.parent;
  node->site = &site;
  node->depth = static_cast<std::uint32_t>(path_.size());
  node->key = scratch_key_;
  node->reason = why.reason;
  if (why.reason != RerecordReason::kFirst) node->reason_detail = DescribeMismatch(why);
  return node;
}

absl::Status GraphTree::StageCopiedInputs(const Function& fn, TreeNode& node,
                                          std::span<const CallInput> inputs) {
  ViewInputs(inputs);
  GRAPHALLOC_ASSIGN_OR_RETURN(PoolRoute route,
                              allocator_.BeginAllocateToPool(pool_, PoolRouteFilter::ForStream(stream_)));
  pool_layout_known_ = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const BufferView& src = inputs[i].view();
    if (scratch_key_.inputs[i].role != InputRole::kCopied || src.bytes == 0) continue;
    GRAPHALLOC_ASSIGN_OR_RETURN(const DevicePtr buffer, allocator_.Allocate(src.bytes, stream_));
    node.copies.emplace_back(static_cast<std::uint32_t>(i), buffer);
    if (i < fn.is_mutated.size() && fn.is_mutated[i])
      node.write_backs.emplace_back(static_cast<std::uint32_t>(i), buffer);
    GRAPHALLOC_RETURN_IF_ERROR(driver_.CopyAsync(buffer, src.ptr, src.bytes, stream_));
    scratch_views_[i] = BufferView{buffer, src.bytes};
  }
  return route.End();
}

namespace {

// Capture ids tag what participants keep per capture (a generator's capture-relative states); unique in the
// process, so a state saved during one recording can never be restored during another (of any tree).
std::atomic<std::uint64_t> next_capture_id{1};

void CancelParticipants(std::span<CaptureParticipant* const> participants) {
  for (CaptureParticipant* participant : participants) participant->OnCaptureCancel();
}

// Begins every participant, in order; when one fails, those begun are cancelled.
absl::Status BeginParticipants(std::span<CaptureParticipant* const> participants) {
  const std::uint64_t capture_id = next_capture_id.fetch_add(1, std::memory_order_relaxed);
  for (std::size_t i = 0; i < participants.size(); ++i) {
    if (absl::Status s = participants[i]->OnCaptureBegin(capture_id); !s.ok()) {
      CancelParticipants(participants.first(i));
      return s;
    }
  }
  return absl::OkStatus();
}

// Ends every participant, in order, keeping what each returns; when one fails, the rest are cancelled.
absl::Status EndParticipants(std::span<CaptureParticipant* const> participants,
                             std::vector<std::unique_ptr<CaptureParticipant::Captured>>& captured) {
  for (std::size_t i = 0; i < participants.size(); ++i) {
    absl::StatusOr<std::unique_ptr<CaptureParticipant::Captured>> ended = participants[i]->OnCaptureEnd();
    if (!ended.ok()) {
      CancelParticipants(participants.subspan(i + 1));
      return ended.status();
    }
    captured.push_back(std::move(*ended));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GraphTree::CaptureBody(const Function& fn, TreeNode& node) {
  // The participants begin before the stream capture (a generator allocates its replay slots, which a
  // capture forbids) and end or are cancelled right after it, so none stays in capture mode.
  const std::span<CaptureParticipant* const> participants(fn.options.generators);
  GRAPHALLOC_RETURN_IF_ERROR(BeginParticipants(participants));
  std::vector<BufferView> produced;
  absl::StatusOr<OwnedGraph> graph = CaptureIntoPool(
      allocator_, pool_, stream_,
      [&](Stream s) -> absl::Status {
        const RecordingScope recording(fn.options.name);
        GRAPHALLOC_ASSIGN_OR_RETURN(produced, fn.body(scratch_views_, s));
        return absl::OkStatus();
      },
      options_.capture);
  if (!graph.ok()) {
    CancelParticipants(participants);
    return graph.status();
  }
  GRAPHALLOC_RETURN_IF_ERROR(EndParticipants(participants, node.participants));
  node.graph = std::move(*graph);
  node.outputs = ClassifyOutputs(scratch_views_, produced);
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> GraphTree::CheckpointRecording(const Function& fn, TreeNode& node) {
  // The copy buffers are dead once the launch that follows each copy has read them: free, so the pool can
  // lend them to later calls of the step (the next copy into them comes with this node's next replay).
  for (const auto& [index, buffer] : node.copies) GRAPHALLOC_RETURN_IF_ERROR(allocator_.Free(buffer));
  GRAPHALLOC_ASSIGN_OR_RETURN(node.checkpoint, CheckpointPool());
  const absl::flat_hash_set<DevicePtr> allocated = AllocatedBlocks(node.checkpoint);
  GRAPHALLOC_RETURN_IF_ERROR(CheckOutputsInPool(fn.options.name, node.outputs, allocated));
  return allocated.size();
}

void GraphTree::NoteLiveness(TreeNode& node) const {
  // What this recording may overwrite (the dead outputs of the path) and what its checkpoint holds (the
  // live ones, and its own new outputs).
  for (std::uint32_t d = 0; d < path_.size(); ++d) {
    const PathEntry& e = path_[d];
    for (std::uint32_t i = 0; i < e.outputs.size(); ++i) {
      if (e.node == nullptr || e.eager || e.node->outputs[i].source != OutputSpec::Source::kNew) continue;
      (e.outputs[i].expired() ? node.expected_dead : node.live_after).push_back(PathOutputRef{d, i});
    }
  }
  for (std::uint32_t j = 0; j < node.outputs.size(); ++j) {
    if (node.outputs[j].source == OutputSpec::Source::kNew) node.live_after.push_back({node.depth, j});
  }
}

TreeNode& GraphTree::AddRecording(CallSite& site, std::unique_ptr<TreeNode> node, const KeyMismatch& why,
                                  std::size_t allocated) {
  const std::string& name = functions_[site.function].options.name;
  if (allocated > node->live_after.size()) {
    Log(TreeLogLevel::kWarning,
        absl::StrFormat("graph tree: recording '%s' left %d allocations in the pool that it did not return; "
                        "they stay allocated for as long as the recording lives (free temporaries during the "
                        "call)",
                        name, allocated - node->live_after.size()));
  }
  ++next_node_id_;
  ++counters_.recordings;
  if (why.reason != RerecordReason::kFirst) {
    ++site.rerecords;
    ++site.reasons[static_cast<int>(why.reason)];
  }
  Log(TreeLogLevel::kInfo,
      absl::StrFormat("graph tree: recorded '%s' as node %d (%s)", name, node->id,
                      why.reason == RerecordReason::kFirst ? "first recording" : node->reason_detail));
  pool_layout_ = node.get();
  pool_layout_known_ = true;
  TreeNode& added = *node;
  site.by_key[added.key.hash].push_back(&added);
  site.nodes.push_back(std::move(node));
  return added;
}

absl::Status GraphTree::FailRecording(CallSite& site, std::unique_ptr<TreeNode> node, const Function& fn,
                                      const absl::Status& error) {
  // The function may have allocated in the pool, so the pool goes back to the parent's layout.
  site.executables.Release(node->exec);
  node.reset();
  ++site.failed_recordings;
  ++counters_.failed_recordings;
  pool_layout_known_ = false;
  std::string message =
      absl::StrFormat("graph tree: recording '%s' failed: %s", fn.options.name, error.message());
  // Restoring may unmap memory that queued copies still write: let them finish first.
  absl::Status cleanup = driver_.StreamSynchronize(stream_);
  if (cleanup.ok()) cleanup = PreparePoolFor(site.parent);
  if (!cleanup.ok())
    absl::StrAppend(&message, " (and putting the pool back failed: ", cleanup.message(), ")");
  return absl::Status(error.code(), message);
}

absl::Status GraphTree::StopRecordingAfter(CallSite& site, std::unique_ptr<TreeNode> node, const Function& fn,
                                           const absl::Status& error,
                                           const absl::flat_hash_set<DevicePtr>& before) {
  // The graph's copies of the inputs are the tree's: free those still allocated (a failure during the
  // capture leaves them so).
  (void)driver_.StreamSynchronize(stream_);
  for (const auto& [index, buffer] : node->copies) (void)allocator_.Free(buffer);
  site.executables.Release(node->exec);
  node.reset();
  ++site.failed_recordings;
  ++counters_.failed_recordings;
  pool_layout_known_ = false;
  if (absl::StatusOr<PoolCheckpoint> after = CheckpointPool(); after.ok()) {
    for (DevicePtr block : AllocatedBlocks(*after)) {
      if (!before.contains(block)) kept_blocks_.insert(block);
    }
  }
  const std::string message =
      absl::StrFormat("graph tree: recording '%s' failed: %s", fn.options.name, error.message());
  disabled_reason_ =
      absl::StrCat(message, "; the tree records nothing from now on and every call runs eagerly");
  Log(TreeLogLevel::kWarning, disabled_reason_);
  return absl::Status(error.code(), message);
}

}  // namespace graphalloc
