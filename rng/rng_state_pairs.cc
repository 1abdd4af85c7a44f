#include "graphalloc/rng/rng_state_pairs.h"

#include "absl/strings/str_format.h"

namespace graphalloc {

RngStatePairs::RngStatePairs(std::shared_ptr<Driver> driver, std::span<const std::uint64_t> seeds) {
  forward_.reserve(seeds.size());
  backward_.reserve(seeds.size());
  for (std::uint64_t seed : seeds) {
    forward_.push_back(std::make_unique<Generator>(driver, seed));
    backward_.push_back(std::make_unique<Generator>(driver, seed));
  }
}

absl::Status RngStatePairs::CheckNotCapturing(const char* what) const {
  for (std::size_t i = 0; i < forward_.size(); ++i) {
    if (forward_[i]->capturing() || backward_[i]->capturing()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("RngStatePairs::%s: the generator pair of random op %d is capturing; call it on "
                          "the host before the "
                          "eager call or before the graph's PrepareReplay, not inside a capture",
                          what, i));
    }
  }
  return absl::OkStatus();
}

std::vector<GeneratorState> RngStatePairs::Snapshot(
    const std::vector<std::unique_ptr<Generator>>& gens) const {
  std::vector<GeneratorState> states;
  states.reserve(gens.size());
  for (const auto& g : gens) states.push_back(g->SaveState());
  return states;
}

absl::StatusOr<std::uint64_t> RngStatePairs::BeginForward() {
  MutexLock lock(&mu_);
  if (absl::Status s = CheckNotCapturing("BeginForward"); !s.ok()) return s;
  const std::uint64_t it = next_iteration_++;
  // The backward generators will not be at this forward's start when its backward comes: snapshot it.
  if (it != backward_position_) saved_[it] = Snapshot(forward_);
  pending_.insert(it);
  return it;
}

absl::Status RngStatePairs::BeginBackward(std::uint64_t iteration, bool retain_graph) {
  MutexLock lock(&mu_);
  if (absl::Status s = CheckNotCapturing("BeginBackward"); !s.ok()) return s;
  if (!pending_.contains(iteration)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "RngStatePairs::BeginBackward(%d): forward %d has no pending backward (%s); a backward without "
        "retain_graph is the last one for its forward",
        iteration, iteration,
        iteration >= next_iteration_ ? "it never ran" : "its last backward already ran"));
  }
  const std::uint64_t p = backward_position_;
  // The backward generators hold the start of forward p, whose backward is still pending (or is this
  // retained one): keep that position before moving them.
  if (pending_.contains(p) && !saved_.contains(p) && (p != iteration || retain_graph)) {
    saved_[p] = Snapshot(backward_);
  }
  if (auto found = saved_.find(iteration); found != saved_.end()) {
    if (p != iteration) {
      for (std::size_t i = 0; i < backward_.size(); ++i) {
        if (absl::Status s = backward_[i]->RestoreState(found->second[i]); !s.ok()) return s;
      }
    }
    if (!retain_graph) saved_.erase(found);
  } else if (p != iteration) {
    return absl::InternalError(
        absl::StrFormat("RngStatePairs::BeginBackward(%d): no snapshot for forward %d and the backward "
                        "generators hold forward "
                        "%d's start; this is a bug in RngStatePairs",
                        iteration, iteration, p));
  }
  backward_position_ = iteration + 1;
  if (!retain_graph) pending_.erase(iteration);
  return absl::OkStatus();
}

absl::Status RngStatePairs::AbandonForward(std::uint64_t iteration) {
  MutexLock lock(&mu_);
  if (!pending_.contains(iteration)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "RngStatePairs::AbandonForward(%d): forward %d is not pending", iteration, iteration));
  }
  pending_.erase(iteration);
  saved_.erase(iteration);
  return absl::OkStatus();
}

absl::Status RngStatePairs::AbandonBackward(std::uint64_t iteration) {
  MutexLock lock(&mu_);
  if (absl::Status s = CheckNotCapturing("AbandonBackward"); !s.ok()) return s;
  pending_.erase(iteration);
  saved_.erase(iteration);
  // BeginBackward snapshots the forward whose start the generators held before moving them, so a pending
  // forward without a snapshot cannot be left; check it, since it would otherwise get wrong masks.
  for (std::uint64_t p : pending_) {
    if (!saved_.contains(p)) {
      return absl::InternalError(absl::StrFormat(
          "RngStatePairs::AbandonBackward(%d): forward %d is pending without a snapshot; this is a bug in "
          "RngStatePairs",
          iteration, p));
    }
  }
  backward_position_ = kUnknownPosition;
  return absl::OkStatus();
}

std::size_t RngStatePairs::snapshot_count() const {
  MutexLock lock(&mu_);
  return saved_.size();
}

bool RngStatePairs::has_snapshot(std::uint64_t iteration) const {
  MutexLock lock(&mu_);
  return saved_.contains(iteration);
}

bool RngStatePairs::is_pending(std::uint64_t iteration) const {
  MutexLock lock(&mu_);
  return pending_.contains(iteration);
}

std::uint64_t RngStatePairs::backward_position() const {
  MutexLock lock(&mu_);
  return backward_position_;
}

}  // namespace graphalloc
