#include "graphalloc/allocator/core/free_block_index.h"

namespace graphalloc {

void FreeBin::ToTree() {
  tree_ = std::make_unique<absl::btree_set<FreeKey>>(flat_.begin(), flat_.end());
  std::vector<FreeKey>().swap(flat_);  // a crowded bin's array would otherwise keep its peak capacity
}

void FreeBin::ToFlat() {
  flat_.assign(tree_->begin(), tree_->end());
  tree_.reset();
}

std::size_t FreeBlockIndex::LargestSize() const {
  const int word = 63 - std::countl_zero(nonempty_words_);
  const int bit = 63 - std::countl_zero(nonempty_[static_cast<std::size_t>(word)]);
  return bins_[static_cast<std::size_t>(word) * 64 + static_cast<std::size_t>(bit)].back().size;
}

}  // namespace graphalloc
