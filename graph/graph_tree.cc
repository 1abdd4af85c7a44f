// GraphTree: creation, the per-call decision (warmup, replay, record, eager), replay and steps. Warmup
// and recording are in tree_recording.cc, the dump in tree_dump.cc.
#include "graphalloc/graph/graph_tree.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace graphalloc {

void LogTreeMessageToStderr(TreeLogLevel level, std::string_view message) {
  if (level != TreeLogLevel::kWarning) return;
  std::fprintf(stderr, "graphalloc: warning: %.*s\n", static_cast<int>(message.size()), message.data());
}

GraphTree::GraphTree(CachingAllocator& allocator, TreeOptions options)
    : allocator_(allocator), driver_(allocator.driver()), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GraphTree>> GraphTree::Create(CachingAllocator& allocator,
                                                             TreeOptions options) {
  if (options.max_recordings < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphTree: max_recordings must be >= 0 (re-records allowed per call site), got %d",
                        options.max_recordings));
  }
  std::unique_ptr<GraphTree> tree(new GraphTree(allocator, std::move(options)));
  if (absl::Status s = tree->Init(); !s.ok()) return s;
  return tree;
}

absl::Status GraphTree::Init() {
  absl::StatusOr<PrivatePool> pool = allocator_.CreatePool();
  if (!pool.ok()) return pool.status();
  pool_ = std::move(*pool);
  absl::StatusOr<PoolCheckpoint> empty = allocator_.Checkpoint(pool_);
  if (!empty.ok()) return empty.status();
  empty_checkpoint_ = std::move(*empty);
  // Pinned from the start: graphs replay into the pool's free memory too (their temporaries, their copy
  // buffers), so none of it may move or go back to the device while the tree lives, not even before the
  // first recording (a warmup's growth must not take the chunks a recording is about to use).
  absl::StatusOr<GraphPin> pin = allocator_.PinForGraph(pool_);
  if (!pin.ok()) return pin.status();
  pin_ = std::move(*pin);
  absl::StatusOr<Stream> stream = driver_.StreamCreate();
  if (!stream.ok()) return stream.status();
  stream_ = *stream;
  absl::StatusOr<Event> ready = driver_.EventCreate();
  if (!ready.ok()) return ready.status();
  caller_ready_ = *ready;
  absl::StatusOr<Event> done = driver_.EventCreate();
  if (!done.ok()) return done.status();
  tree_done_ = *done;
  return absl::OkStatus();
}

GraphTree::~GraphTree() {
  epoch_->step.store(TreeEpoch::kDestroyed, std::memory_order_release);
  // Replays run on the callers' streams: wait for all of them before the pool's memory can go.
  if (launched_) (void)driver_.DeviceSynchronize();
  (void)driver_.StreamSynchronize(stream_);
  path_.clear();
  current_ = nullptr;
  roots_.clear();  // graphs and executables
  // Everything still allocated in the pool (outputs of the last recording, warmup outputs) is the tree's:
  // restoring the empty layout frees it, so the pool can return its memory once the handles are gone.
  // Except what a recording kept when recording was disabled: its holders free that, and the pool goes
  // back to the device after the last of them.
  if (pool_ && kept_blocks_.empty()) {
    (void)allocator_.Restore(pool_, empty_checkpoint_);
  } else if (pool_) {
    FreeAllButKept();
  }
  pin_.Reset();
  pool_.Reset();
  if (caller_ready_ != Event{}) (void)driver_.EventDestroy(caller_ready_);
  if (tree_done_ != Event{}) (void)driver_.EventDestroy(tree_done_);
  if (stream_ != kDefaultStream) (void)driver_.StreamDestroy(stream_);
}

void GraphTree::FreeAllButKept() {
  absl::StatusOr<PoolCheckpoint> layout = CheckpointPool();
  if (!layout.ok()) return;
  for (const CheckpointSegment& seg : layout->segments) {
    for (const CheckpointBlock& b : seg.blocks) {
      const DevicePtr ptr = seg.base + b.offset;
      if (b.allocated && !kept_blocks_.contains(ptr)) (void)allocator_.Free(ptr);
    }
  }
}

absl::StatusOr<FunctionId> GraphTree::Register(TreeFunction function, FunctionOptions options) {
  if (!function) return absl::InvalidArgumentError("GraphTree::Register: empty function");
  if (options.warmup_calls < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("GraphTree::Register: warmup_calls must be >= 0, got %d", options.warmup_calls));
  }
  for (std::size_t i = 0; i < options.generators.size(); ++i) {
    if (options.generators[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("GraphTree::Register: generator %d is null", i));
    }
  }
  const auto id = static_cast<FunctionId>(functions_.size());
  if (options.name.empty()) options.name = absl::StrCat("function ", id);
  Function fn;
  fn.body = std::move(function);
  for (std::size_t i : options.static_inputs) {
    if (i >= fn.is_static.size()) fn.is_static.resize(i + 1, false);
    fn.is_static[i] = true;
  }
  for (std::size_t i : options.mutated_inputs) {
    if (i >= fn.is_mutated.size()) fn.is_mutated.resize(i + 1, false);
    fn.is_mutated[i] = true;
  }
  fn.origin = std::make_shared<const OutputOrigin>(OutputOrigin{epoch_, options.name, this});
  fn.options = std::move(options);
  functions_.push_back(std::move(fn));
  return id;
}

void GraphTree::Log(TreeLogLevel level, std::string_view message) const {
  if (options_.log) {
    options_.log(level, message);
  } else {
    LogTreeMessageToStderr(level, message);
  }
}

std::uint64_t GraphTree::step() const { return epoch_->step.load(std::memory_order_relaxed); }

void GraphTree::BeginStep() {
  if (path_.empty() && !in_warmup_) return;  // nothing handed out this step: it can go on
  EndStep();
}

void GraphTree::EndStep() {
  FreeWarmupBlocks(/*all=*/true);
  path_.clear();
  current_ = nullptr;
  in_warmup_ = false;
  epoch_->step.fetch_add(1, std::memory_order_acq_rel);
  counters_.steps = step();
}

CallSite& GraphTree::SiteFor(TreeNode* parent, FunctionId function) {
  auto& sites = parent == nullptr ? roots_ : parent->children;
  std::unique_ptr<CallSite>& site = sites[function];
  if (site == nullptr)
    site = std::make_unique<CallSite>(driver_, options_.executables_per_site,
                                      options_.update_executables_first, parent, function);
  return *site;
}

absl::Status GraphTree::CheckInputs(std::span<const CallInput> inputs) const {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const OutputState* out = inputs[i].output();
    if (out == nullptr || out->Current()) continue;
    const absl::Status s = out->Check();
    return absl::Status(s.code(), absl::StrCat("input ", i, ": ", s.message()));
  }
  return absl::OkStatus();
}

InputRole GraphTree::RoleOf(const Function& fn, std::size_t i, const CallInput& input) const {
  if (i < fn.is_static.size() && fn.is_static[i]) return InputRole::kStatic;
  const OutputState* out = input.output();
  if (out != nullptr && out->recorded && out->origin->tree == this && out->Current())
    return InputRole::kManaged;
  return InputRole::kCopied;
}

void GraphTree::ViewInputs(std::span<const CallInput> inputs) {
  scratch_views_.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) scratch_views_[i] = inputs[i].view();
}

void GraphTree::BuildKey(const Function& fn, std::span<const CallInput> inputs) {
  scratch_key_.inputs.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const BufferView& v = inputs[i].view();
    const InputRole role = RoleOf(fn, i, inputs[i]);
    scratch_key_.inputs[i] =
        KeyInput{role, role == InputRole::kCopied ? 0 : v.ptr, v.bytes, inputs[i].layout()};
  }
  scratch_key_.Rehash();
}

bool GraphTree::LivenessAllows(const TreeNode& node) const {
  for (const PathOutputRef& r : node.expected_dead) {
    if (!path_[r.depth].outputs[r.index].expired()) return false;
  }
  return true;
}

TreeNode* GraphTree::FindReplayable(CallSite& site) const {
  auto it = site.by_key.find(scratch_key_.hash);
  if (it == site.by_key.end()) return nullptr;
  for (TreeNode* node : it->second) {
    if (node->key.inputs == scratch_key_.inputs && LivenessAllows(*node)) return node;
  }
  return nullptr;
}

KeyMismatch GraphTree::ExplainMiss(const CallSite& site) const {
  KeyMismatch best;
  bool have = false;
  for (const std::unique_ptr<TreeNode>& node : site.nodes) {
    if (node->key == scratch_key_) {  // same key: it is the liveness that differs
      KeyMismatch m;
      m.reason = RerecordReason::kLiveness;
      for (const PathOutputRef& r : node->expected_dead) {
        if (!path_[r.depth].outputs[r.index].expired()) {
          m.depth = r.depth;
          m.output = r.index;
          break;
        }
      }
      return m;
    }
    KeyMismatch m = CompareKeys(node->key, scratch_key_);
    if (!have || m.differences <= best.differences) best = m;  // ties: the latest recording
    have = true;
  }
  return best;
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Call(FunctionId id, std::span<const CallInput> inputs,
                                                        Stream stream) {
  if (id >= functions_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphTree::Call: unknown function id %d (%d functions registered)", id, functions_.size()));
  }
  if (absl::Status s = CheckInputs(inputs); !s.ok()) return s;
  Function& fn = functions_[id];
  if (options_.implicit_steps && !path_.empty() && path_.front().function == id) EndStep();
  if (!disabled_reason_.empty()) return RunEager(fn, nullptr, inputs, stream);

  CallSite* site = in_warmup_ ? nullptr : &SiteFor(current_, id);
  if (site != nullptr && fn.runs_eagerly && !site->eager) MakeSiteEager(*site, fn.eager_warning);
  if (site != nullptr && site->eager) {
    ++site->eager_calls;
    return RunEager(fn, site, inputs, stream);
  }
  if (fn.runs_eagerly) return RunEager(fn, nullptr, inputs, stream);  // in a warmup step
  if (in_warmup_ || fn.warmup_runs < fn.options.warmup_calls) return Warmup(id, inputs, stream);

  BuildKey(fn, inputs);
  if (TreeNode* node = FindReplayable(*site)) return Replay(*node, inputs, stream);

  KeyMismatch why;  // kFirst when nothing is recorded here yet
  if (!site->nodes.empty()) {
    why = ExplainMiss(*site);
    if (site->rerecords >= options_.max_recordings) {
      ++site->eager_calls;
      const std::string where = site->parent == nullptr
                                    ? std::string("as a root")
                                    : absl::StrFormat("under node %d (function '%s')", site->parent->id,
                                                      functions_[site->parent->function].options.name);
      MakeSiteEager(
          *site,
          absl::StrFormat("graph tree: function '%s' %s would be recorded again because %s, but it was "
                          "already re-recorded %d times there (max_recordings = %d); from now on it runs "
                          "eagerly there (no graph, outside the pool). Keep that input's address fixed, "
                          "pass it as a copied input, or raise TreeOptions::max_recordings",
                          fn.options.name, where, DescribeMismatch(why), site->rerecords,
                          options_.max_recordings));
      Log(TreeLogLevel::kWarning, site->eager_warning);
      return RunEager(fn, site, inputs, stream);
    }
  }
  return Record(*site, inputs, stream, why);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::CallEagerly(FunctionId id,
                                                               std::span<const CallInput> inputs,
                                                               Stream stream) {
  if (id >= functions_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GraphTree::CallEagerly: unknown function id %d (%d functions registered)", id, functions_.size()));
  }
  if (absl::Status s = CheckInputs(inputs); !s.ok()) return s;
  return RunEager(functions_[id], nullptr, inputs, stream);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::Replay(TreeNode& node, std::span<const CallInput> inputs,
                                                          Stream stream) {
  for (const auto& [index, buffer] : node.copies) {
    const BufferView& src = inputs[index].view();
    if (absl::Status s = driver_.CopyAsync(buffer, src.ptr, src.bytes, stream); !s.ok()) return s;
  }
  if (absl::Status s = LaunchNode(node, inputs, stream); !s.ok()) return s;
  ++node.replays;
  ++counters_.replays;
  last_call_ = TreeCallInfo{TreeCallInfo::Kind::kReplay, node.id};
  return FinishRecordedCall(node, inputs, stream);
}

absl::Status GraphTree::LaunchNode(TreeNode& node, std::span<const CallInput> inputs, Stream stream) {
  absl::StatusOr<GraphExec> exec = node.site->executables.Acquire(node.exec, node.graph);
  if (!exec.ok()) return exec.status();
  if (absl::Status s = ArmParticipants(node, stream); !s.ok()) return s;
  if (absl::Status s = driver_.GraphLaunch(*exec, stream); !s.ok()) return s;
  launched_ = true;
  return WriteBack(node, inputs, stream);
}

absl::Status GraphTree::ArmParticipants(const TreeNode& node, Stream stream) {
  const std::vector<CaptureParticipant*>& participants = functions_[node.function].options.generators;
  for (std::size_t i = 0; i < node.participants.size(); ++i) {
    if (absl::Status s = participants[i]->ArmReplay(*node.participants[i], stream); !s.ok()) {
      return Annotate(
          s, absl::StrFormat("graph tree: preparing generator %d for a launch of node %d", i, node.id));
    }
  }
  return absl::OkStatus();
}

absl::Status GraphTree::WriteBack(const TreeNode& node, std::span<const CallInput> inputs, Stream stream) {
  for (const auto& [index, buffer] : node.write_backs) {
    const BufferView& dst = inputs[index].view();
    if (absl::Status s = driver_.CopyAsync(dst.ptr, buffer, dst.bytes, stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::FinishRecordedCall(TreeNode& node,
                                                                      std::span<const CallInput> inputs,
                                                                      Stream stream) {
  const Function& fn = functions_[node.function];
  PathEntry& entry = path_.emplace_back();
  entry.node = &node;
  entry.function = node.function;
  std::vector<TreeOutput> outputs =
      MakeOutputs(fn, node.outputs, inputs, OutputKind::kPool, /*recorded=*/true, entry);
  current_ = &node;
  return MaybeClone(fn, std::move(outputs), stream);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::MaybeClone(const Function& fn,
                                                              std::vector<TreeOutput> outputs,
                                                              Stream stream) {
  if (!fn.options.clone_outputs) return outputs;
  for (TreeOutput& out : outputs) {
    if (out.kind() != OutputKind::kPool) continue;
    absl::StatusOr<TreeOutput> clone = out.Clone(stream);
    if (!clone.ok()) return clone.status();
    out = std::move(*clone);  // the pool output dies here: the tree may reuse its memory
  }
  return outputs;
}

void GraphTree::MakeSiteEager(CallSite& site, std::string warning) {
  site.eager = true;
  site.eager_warning = std::move(warning);
  auto node = std::make_unique<TreeNode>();
  node->id = next_node_id_++;
  node->eager = true;
  node->function = site.function;
  node->parent = site.parent;
  node->site = &site;
  node->depth = site.parent != nullptr ? site.parent->depth + 1 : 0;
  site.eager_node = std::move(node);
}

absl::StatusOr<std::vector<TreeOutput>> GraphTree::RunEager(Function& fn, CallSite* site,
                                                            std::span<const CallInput> inputs,
                                                            Stream stream) {
  ViewInputs(inputs);
  absl::StatusOr<std::vector<BufferView>> produced = fn.body(scratch_views_, stream);
  if (!produced.ok()) return produced.status();
  ++counters_.eager_runs;
  // New outputs were allocated outside any pool: the handles own them. Aliases of inputs are borrowed.
  const std::vector<OutputSpec> specs = ClassifyOutputs(scratch_views_, *produced);
  PathEntry& entry = path_.emplace_back();
  entry.eager = true;
  entry.function = static_cast<FunctionId>(&fn - functions_.data());
  if (site != nullptr) {
    entry.node = site->eager_node.get();
    current_ = entry.node;
  }
  last_call_ = TreeCallInfo{TreeCallInfo::Kind::kEager, 0};
  return MakeOutputs(fn, specs, inputs,
                     options_.eager_outputs_owned ? OutputKind::kOwned : OutputKind::kBorrowed,
                     /*recorded=*/false, entry);
}

}  // namespace graphalloc
