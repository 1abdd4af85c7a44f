// The executable graphs of one call site (a parent node and a function), shared by the site's recordings.
//
// Every recording keeps its captured graph; an executable is what launches it. Instantiating a 100-node
// graph costs about 400 us on an H100, updating an executable of the same topology in place
// (cuGraphExecUpdate) about 17 us (docs/graph_tree_rules.md, "Executables per call site"). So:
//   - a new recording at a site that has executables takes the least recently launched one and updates it
//     in place (the common re-record is a parameter that moved for good: the old recording is done with);
//     only when the driver refuses (another topology) is it instantiated anew;
//   - a recording that lost its executable that way and is replayed again (addresses that alternate) gets
//     a new one of its own while the site has fewer than `capacity`, so alternating recordings stop
//     trading one executable after their first round; past the capacity it updates the least recently
//     launched one. A replay never re-records: the graph is kept.
// With update_first off, new recordings are instantiated while under the capacity too.
#ifndef GRAPHALLOC_GRAPH_SITE_EXECUTABLES_H_
#define GRAPHALLOC_GRAPH_SITE_EXECUTABLES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "graphalloc/graph/capture_session.h"

namespace graphalloc {

// Which executable of its site a recording holds; kept by the recording.
struct ExecHolder {
  static constexpr std::size_t kNone = ~std::size_t{0};
  std::size_t slot = kNone;
  bool evicted = false;  // it had an executable and another recording took it
};

struct ExecCounters {
  std::uint64_t instantiations = 0;
  std::uint64_t updates = 0;          // successful in-place updates
  std::uint64_t refused_updates = 0;  // updates the driver refused (then instantiated anew)
};

class SiteExecutables {
 public:
  SiteExecutables(Driver& driver, std::size_t capacity, bool update_first)
      : driver_(driver), capacity_(capacity < 1 ? 1 : capacity), update_first_(update_first) {}
  SiteExecutables(const SiteExecutables&) = delete;
  SiteExecutables& operator=(const SiteExecutables&) = delete;

  // The executable that launches `graph` for `holder` (see the file comment). `holder` must stay at its
  // address while it holds a slot.
  absl::StatusOr<GraphExec> Acquire(ExecHolder& holder, const OwnedGraph& graph) {
    if (holder.slot != ExecHolder::kNone && slots_[holder.slot].holder == &holder) {
      slots_[holder.slot].last_use = ++clock_;
      return slots_[holder.slot].exec.get();
    }
    return AcquireSlow(holder, graph);
  }

  // Forgets `holder` (its recording is going away); its executable stays for others.
  void Release(ExecHolder& holder);

  const ExecCounters& counters() const { return counters_; }
  std::size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    OwnedGraphExec exec;
    ExecHolder* holder = nullptr;
    std::uint64_t last_use = 0;
  };

  absl::StatusOr<GraphExec> AcquireSlow(ExecHolder& holder, const OwnedGraph& graph);
  void Give(std::size_t slot, ExecHolder& holder);

  Driver& driver_;
  const std::size_t capacity_;
  const bool update_first_;
  std::vector<Slot> slots_;
  std::uint64_t clock_ = 0;
  ExecCounters counters_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_SITE_EXECUTABLES_H_
