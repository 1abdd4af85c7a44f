#include "graphalloc/graph/tree_output.h"

#include "absl/strings/str_format.h"
#include "graphalloc/allocator/core/caching_allocator.h"

namespace graphalloc {

OutputState::~OutputState() {
  // An owned buffer goes back to the default pool with its last handle; a failure here (the allocator
  // already gone is the caller's bug, documented on TreeOutput) has nowhere to be reported.
  if (kind == OutputKind::kOwned && allocator != nullptr && buffer.ptr != 0)
    (void)allocator->Free(buffer.ptr);
}

absl::Status OutputState::Check() const {
  if (Current()) return absl::OkStatus();
  const std::uint64_t now = origin->epoch->step.load(std::memory_order_acquire);
  if (now == TreeEpoch::kDestroyed) {
    return absl::FailedPreconditionError(
        absl::StrFormat("output %d of graph-tree function '%s' (step %d) is gone: the tree that produced it "
                        "was destroyed and "
                        "its pool freed; clone outputs that must outlive the tree (TreeOutput::Clone, or "
                        "FunctionOptions::clone_outputs)",
                        index, origin->function, step));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "output %d of graph-tree function '%s' (step %d) has been overwritten: the tree has begun step %d, "
      "which reuses its memory; to keep it, clone it before the next step (TreeOutput::Clone, or "
      "FunctionOptions::clone_outputs), or begin the next step (BeginStep) only after its last use",
      index, origin->function, step, now));
}

std::shared_ptr<OutputState> MakeOutputView(const std::shared_ptr<OutputState>& base, BufferView view) {
  if (view == base->buffer) return base;
  auto state = std::make_shared<OutputState>();
  state->kind = base->kind == OutputKind::kOwned ? OutputKind::kBorrowed : base->kind;
  state->buffer = view;
  state->step = base->step;
  state->recorded = base->recorded;
  state->index = base->index;
  state->origin = base->origin;
  state->allocator = base->allocator;
  state->base = base;
  return state;
}

absl::Status TreeOutput::Check() const {
  if (state_ == nullptr) return absl::FailedPreconditionError("empty TreeOutput: it holds no output");
  return state_->Check();
}

absl::StatusOr<DevicePtr> TreeOutput::ptr() const {
  if (absl::Status s = Check(); !s.ok()) return s;
  return state_->buffer.ptr;
}

absl::StatusOr<BufferView> TreeOutput::view() const {
  if (absl::Status s = Check(); !s.ok()) return s;
  return state_->buffer;
}

absl::StatusOr<TreeOutput> TreeOutput::Clone(Stream stream) const {
  if (absl::Status s = Check(); !s.ok()) return s;
  auto copy = std::make_shared<OutputState>();
  copy->kind = OutputKind::kOwned;
  copy->index = state_->index;
  copy->origin = state_->origin;
  copy->allocator = state_->allocator;
  if (state_->buffer.bytes == 0) return TreeOutput(std::move(copy));
  if (state_->allocator == nullptr) {
    return absl::FailedPreconditionError("TreeOutput::Clone: this output has no allocator to clone into");
  }
  absl::StatusOr<DevicePtr> ptr = state_->allocator->Allocate(state_->buffer.bytes, stream);
  if (!ptr.ok()) return ptr.status();
  copy->buffer = BufferView{*ptr, state_->buffer.bytes};  // owned from here: freed if the copy fails
  if (absl::Status s =
          state_->allocator->driver().CopyAsync(*ptr, state_->buffer.ptr, state_->buffer.bytes, stream);
      !s.ok()) {
    return s;
  }
  return TreeOutput(std::move(copy));
}

}  // namespace graphalloc
