// RngStatePairs: per-random-op forward/backward generator pairs, so a backward (or a recomputation in it)
// draws exactly the random numbers its own forward drew. C++ version of PyTorch's
// _AutogradRngStateTracker (docs/rng.md, "Forward/backward state pairs").
//
// Each random op i of a (graphed) forward gets two generators that start equal (same seed, offset 0):
// forward_generator(i), which every forward draws from, and backward_generator(i), which every backward
// draws from. Both advance by the same increments, so in the in-order case (f0 b0 f1 b1) the backward
// generators are already where their forward started: no snapshot, no host work. Otherwise:
//   - BeginForward() snapshots the forward generators' start (a GeneratorState VALUE) when the backward
//     generators will not be positioned there when this forward's backward comes;
//   - BeginBackward(iteration, retain_graph) snapshots the backward generators' position if it is the start
//     of a forward whose backward is still pending (or of this forward when its graph is retained), then
//     restores the backward generators to this forward's start;
//   - the snapshot of a forward is dropped when its last backward (retain_graph == false) has run.
// That makes out-of-order backwards (f0 f1 b1 b0) and repeated backwards (retain_graph) reproduce their
// forward's masks exactly, with at most one snapshot per pending forward per op.
//
// Call BeginForward / BeginBackward on the host before the eager forward/backward, or before the
// PrepareReplay of its graph, never while one of these generators is capturing. Thread-safe.
#ifndef GRAPHALLOC_RNG_RNG_STATE_PAIRS_H_
#define GRAPHALLOC_RNG_RNG_STATE_PAIRS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/rng/generator.h"

namespace graphalloc {

class RngStatePairs {
 public:
  // One pair per seed (one per random op); both generators of pair i start at (seeds[i], 0).
  RngStatePairs(std::shared_ptr<Driver> driver, std::span<const std::uint64_t> seeds);

  std::size_t num_ops() const { return forward_.size(); }
  Generator& forward_generator(std::size_t op) { return *forward_[op]; }
  Generator& backward_generator(std::size_t op) { return *backward_[op]; }

  // Starts a forward; returns its iteration number (keep it with the forward's saved context).
  absl::StatusOr<std::uint64_t> BeginForward();

  // Positions the backward generators at the start of forward `iteration`. `retain_graph`: this backward
  // may run again (the snapshot is kept). FailedPrecondition for a forward with no pending backward.
  absl::Status BeginBackward(std::uint64_t iteration, bool retain_graph);

  // A forward that failed after BeginForward: forgets it (no backward will come). The backward
  // generators are untouched.
  absl::Status AbandonForward(std::uint64_t iteration);
  // A backward that failed after BeginBackward(iteration, ...): forgets the forward (its snapshot too), as a
  // last backward would. The failed backward may have drawn any amount, so where the backward generators
  // stand is unknown: every later backward restores its forward's snapshot (BeginForward takes one for
  // every forward from now on) instead of trusting the in-order position.
  absl::Status AbandonBackward(std::uint64_t iteration);

  // Introspection for tests and debugging.
  std::size_t snapshot_count() const;
  bool has_snapshot(std::uint64_t iteration) const;
  bool is_pending(std::uint64_t iteration) const;
  std::uint64_t backward_position() const;

 private:
  absl::Status CheckNotCapturing(const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<GeneratorState> Snapshot(const std::vector<std::unique_ptr<Generator>>& gens) const;

  std::vector<std::unique_ptr<Generator>> forward_;
  std::vector<std::unique_ptr<Generator>> backward_;
  mutable Mutex mu_;
  std::uint64_t next_iteration_ ABSL_GUARDED_BY(mu_) = 0;
  // The forward iteration whose starting state the backward generators currently hold (kUnknownPosition
  // after a failed backward).
  static constexpr std::uint64_t kUnknownPosition = ~std::uint64_t{0};
  std::uint64_t backward_position_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<std::uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uint64_t, std::vector<GeneratorState>> saved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_RNG_RNG_STATE_PAIRS_H_
