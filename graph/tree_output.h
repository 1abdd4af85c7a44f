// Output buffers a GraphTree hands back, and the arguments a tree call takes.
//
// A replay writes its outputs to the same pool addresses every time, so an output is only good until the
// tree begins another step (generation): the next replay of that node, or any recording that reuses the
// pool, may overwrite it. Every pool output therefore carries the step that produced it and the tree's
// shared step counter (TreeEpoch); reading one from an earlier step, or passing it back into the tree, is
// an error that names the function and says how to keep it, never a silent read of newer data.
//
// Handles are reference counted: when the last TreeOutput of an output is gone, the output is dead, and
// the tree may reuse its memory for what it records next (the tree watches the count through weak
// references; liveness patterns are part of what a recording is matched on).
#ifndef GRAPHALLOC_GRAPH_TREE_OUTPUT_H_
#define GRAPHALLOC_GRAPH_TREE_OUTPUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class CachingAllocator;

// A device buffer: where it is and how many bytes it holds.
struct BufferView {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;

  friend bool operator==(const BufferView&, const BufferView&) = default;
};

// The step counter of one tree, shared with every output it produced so that checking an output costs one
// atomic load, also after the tree is gone (the tree then sets kDestroyed).
struct TreeEpoch {
  static constexpr std::uint64_t kDestroyed = ~std::uint64_t{0};
  std::atomic<std::uint64_t> step{1};
};

// What every output of one registered function shares: the tree's epoch, the function's name for error
// messages and which tree it is (an output passed back into its own tree is a "managed" input).
struct OutputOrigin {
  std::shared_ptr<TreeEpoch> epoch;
  std::string function;
  const void* tree = nullptr;
};

enum class OutputKind {
  kPool,      // in the tree's private pool: valid until the tree begins another step
  kOwned,     // a default-pool buffer owned by the handles (eager fallback, clones): freed with the last one
  kBorrowed,  // a buffer the caller passed in (a static input returned as an output), or empty
};

// The state behind TreeOutput handles. Created by the tree; users see it through TreeOutput.
struct OutputState {
  OutputKind kind = OutputKind::kPool;
  BufferView buffer;
  std::uint64_t step = 0;   // kPool: the step that produced it
  bool recorded = false;    // kPool: produced by a recorded node, so its address is stable
  std::uint32_t index = 0;  // which output of the call
  std::shared_ptr<const OutputOrigin> origin;
  CachingAllocator* allocator = nullptr;  // kOwned: frees the buffer; every kind: Clone allocates from it
  // A view of another output (an output aliasing part of an input or of another output): holding the base
  // keeps it live, so liveness stays exact.
  std::shared_ptr<OutputState> base;

  OutputState() = default;
  OutputState(const OutputState&) = delete;
  OutputState& operator=(const OutputState&) = delete;
  ~OutputState();

  // OK while the buffer holds what the call produced; FailedPrecondition (naming the function, the output
  // and what to do) once a later step of its tree may have overwritten it.
  absl::Status Check() const;
  bool Current() const {
    return kind != OutputKind::kPool || origin->epoch->step.load(std::memory_order_acquire) == step;
  }
};

// `base` itself when `view` is its whole buffer; otherwise a view of it: the same kind (kOwned becomes
// kBorrowed: the base frees the buffer), step and origin, so the overwritten check reads the base's.
std::shared_ptr<OutputState> MakeOutputView(const std::shared_ptr<OutputState>& base, BufferView view);

// A handle to one output of a tree call. Cheap to copy (a shared pointer).
class TreeOutput {
 public:
  TreeOutput() = default;
  explicit TreeOutput(std::shared_ptr<OutputState> state) : state_(std::move(state)) {}

  // The buffer's device address; FailedPrecondition once overwritten (see the file comment).
  absl::StatusOr<DevicePtr> ptr() const;
  // The buffer's address and size; the same error.
  absl::StatusOr<BufferView> view() const;
  std::size_t bytes() const { return state_ ? state_->buffer.bytes : 0; }
  // OK while readable.
  absl::Status Check() const;
  bool overwritten() const { return state_ != nullptr && !state_->Current(); }
  bool empty() const { return state_ == nullptr; }
  OutputKind kind() const { return state_ ? state_->kind : OutputKind::kBorrowed; }

  // A copy in a new buffer of the default pool, owned by the returned handle (freed with its last copy),
  // enqueued on `stream` (stream-ordered after the work that produced this output when that was on
  // `stream` too). It stays valid across steps: clone what must outlive the step.
  absl::StatusOr<TreeOutput> Clone(Stream stream) const;

  const std::shared_ptr<OutputState>& state() const { return state_; }

 private:
  std::shared_ptr<OutputState> state_;
};

// One argument of GraphTree::Call: a plain device buffer, or an output of an earlier call (checked for
// being overwritten; an output of this tree's current step is a "managed" input: it lives at a stable
// pool address, so it is never copied, only its address checked).
class CallInput {
 public:
  CallInput(BufferView buffer) : view_(buffer) {}  // NOLINT(google-explicit-constructor): reads naturally
  CallInput(DevicePtr ptr, std::size_t bytes) : view_{ptr, bytes} {}
  // `output` must outlive the call (it is the caller's handle; the tree may share its state).
  CallInput(const TreeOutput& output)  // NOLINT(google-explicit-constructor)
      : view_(output.state() ? output.state()->buffer : BufferView{}),
        handle_(output.state() ? &output.state() : nullptr) {}

  // Tags the argument with its layout (a tensor's dtype, shape and strides, hashed by the caller; 0: none):
  // part of the recording key, so a call with the same bytes in another layout does not replay a recording
  // made for the first.
  CallInput& WithLayout(std::uint64_t layout) {
    layout_ = layout;
    return *this;
  }
  std::uint64_t layout() const { return layout_; }

  const BufferView& view() const { return view_; }
  // The output this argument came from, or nullptr for a plain buffer.
  const OutputState* output() const { return handle_ != nullptr ? handle_->get() : nullptr; }
  // The caller's handle on it (for an output returned as is), or nullptr.
  const std::shared_ptr<OutputState>* handle() const { return handle_; }

 private:
  BufferView view_;
  const std::shared_ptr<OutputState>* handle_ = nullptr;
  std::uint64_t layout_ = 0;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_TREE_OUTPUT_H_
