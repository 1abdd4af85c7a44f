// Finds undeclared writes to a tree function's copied inputs during a warmup call, by comparing their bytes
// before and after it. A recording reads copied inputs from the graph's own copies, so a write it makes
// would land there and the caller's buffer would silently stop changing; the tree runs such a function
// eagerly instead (graph_tree.h, TreeOptions::check_input_mutation).
#ifndef GRAPHALLOC_GRAPH_INPUT_MUTATION_CHECK_H_
#define GRAPHALLOC_GRAPH_INPUT_MUTATION_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "graphalloc/allocator/device/driver.h"
#include "graphalloc/graph/tree_output.h"

namespace graphalloc {

class InputMutationCheck {
 public:
  explicit InputMutationCheck(Driver& driver) : driver_(driver) {}

  // Copies input `index` (`buffer`) to the host. Call for each checked input after the work that wrote
  // them last has finished (the caller synchronizes).
  absl::Status Before(std::size_t index, BufferView buffer);
  // After the call's work has finished: the first checked input whose bytes changed, if any.
  absl::StatusOr<std::optional<std::size_t>> FirstChanged();

 private:
  struct Saved {
    std::size_t index = 0;
    BufferView buffer;
    std::vector<std::uint8_t> bytes;
  };
  Driver& driver_;
  std::vector<Saved> saved_;
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_GRAPH_INPUT_MUTATION_CHECK_H_
