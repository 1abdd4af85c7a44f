// Releases that must wait until no retained backward can run any more (docs/graphed_step.md, "Lifetime
// rules"; DeepSpeed's ZeRO-3 bug, PR 8045).
//
// A backward run with retain_graph may run again, and it reads what its forward saved and the parameters
// it was recorded with. A release asked for meanwhile (a parameter shard handed back, a buffer freed) must
// therefore wait: it is queued, and the queue is flushed exactly once, in the epilogue of the backward that
// leaves no retained backward behind (the last one of its forward, or one that failed). The queue belongs
// to a GraphedStep; tests read its size to check that nothing stays deferred after a step.
#ifndef GRAPHALLOC_LIFETIME_DEFERRED_RELEASES_H_
#define GRAPHALLOC_LIFETIME_DEFERRED_RELEASES_H_

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace graphalloc {

class DeferredReleases {
 public:
  using Release = std::function<void()>;

  // Queues `release` (described by `what`, for debugging).
  void Defer(std::string what, Release release) { queue_.push_back({std::move(what), std::move(release)}); }

  // Runs every queued release in the order they were asked for and empties the queue. The queue is taken
  // first, so a release that asks for another release queues it for the next flush. Releases must not
  // throw (they run in epilogues, also while an error is on its way out).
  void Flush() {
    std::vector<Entry> todo;
    todo.swap(queue_);
    for (Entry& entry : todo) entry.release();
  }

  std::size_t size() const { return queue_.size(); }
  bool empty() const { return queue_.empty(); }
  // What is queued, in order.
  std::vector<std::string> Describe() const {
    std::vector<std::string> out;
    for (const Entry& e : queue_) out.push_back(e.what);
    return out;
  }

 private:
  struct Entry {
    std::string what;
    Release release;
  };
  std::vector<Entry> queue_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_LIFETIME_DEFERRED_RELEASES_H_
