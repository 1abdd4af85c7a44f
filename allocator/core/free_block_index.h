// The free blocks of one BlockPool, ordered by (size, address): best fit is the first block at or after
// the request's size. Same order and results as one ordered set (what PyTorch uses, a std::set), faster:
//
// Sizes fall into bins, 32 per power of two (TLSF's mapping, monotone in the size), and a two-level bitmap
// finds the first non-empty bin at or after a size in a few instructions. A bin is a sorted array: a pool
// holds tens of free blocks spread over hundreds of bins, so a bin holds one or two and an insert or an
// erase shifts a few entries, with no node to allocate or rebalance (the ordered set spent ~45% of a warm
// trace replay there). A bin crowded past a few dozen blocks (10,000 free blocks, or many equal sizes apart
// from each other) switches to a B-tree, so that no operation is worse than logarithmic. An iterator keeps
// its key's place in the bin, so that the allocation's erase of the block best fit found does not search
// for it again (at 100,000 live blocks that second search was a tenth of a churn operation).
#ifndef GRAPHALLOC_ALLOCATOR_CORE_FREE_BLOCK_INDEX_H_
#define GRAPHALLOC_ALLOCATOR_CORE_FREE_BLOCK_INDEX_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/container/btree_set.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

struct Block;

struct FreeKey {
  std::size_t size;
  DevicePtr ptr;
  Block* block;

  friend bool operator<(const FreeKey& a, const FreeKey& b) {
    return a.size != b.size ? a.size < b.size : a.ptr < b.ptr;
  }
  friend bool operator==(const FreeKey& a, const FreeKey& b) { return a.size == b.size && a.ptr == b.ptr; }
};

// The free blocks of one bin, sorted: an array while few, a B-tree while crowded.
class FreeBin {
 public:
  // Where a key is: its index in the array, or its place in the tree. Any insert or erase in the bin
  // invalidates it.
  struct Position {
    const FreeKey* key = nullptr;  // nullptr: past the last key
    std::size_t flat = 0;
    absl::btree_set<FreeKey>::const_iterator tree{};
  };

  bool empty() const { return tree_ == nullptr ? flat_.empty() : tree_->empty(); }
  std::size_t size() const { return tree_ == nullptr ? flat_.size() : tree_->size(); }
  Position Front() const;
  const FreeKey& back() const { return tree_ == nullptr ? flat_.back() : *tree_->rbegin(); }

  // The first key >= `key`, or nullptr.
  const FreeKey* LowerBound(const FreeKey& key) const { return Find(key).key; }
  // The position of the first key >= `key`.
  Position Find(const FreeKey& key) const;
  // Erases the key at `pos` (from Find or Front, the bin unchanged since): the allocation's erase of the
  // block best fit just found, without searching for it again.
  void EraseAt(const Position& pos);

  // Insert returns false if an equal key (same size and address) is already there; Erase returns false if
  // none is.
  bool Insert(const FreeKey& key);
  bool Erase(const FreeKey& key);
  bool Contains(const FreeKey& key) const;

 private:
  // Above kToTree entries (768 bytes) the array's shifts and the cache lines its search touches cost more
  // than the tree's walk; the tree goes back to an array at kToFlat, well below, so that a bin near the
  // limit does not convert on every operation.
  static constexpr std::size_t kToTree = 32;
  static constexpr std::size_t kToFlat = 8;

  void ToTree();
  void ToFlat();

  std::vector<FreeKey> flat_;                       // sorted; empty while tree_ is set
  std::unique_ptr<absl::btree_set<FreeKey>> tree_;  // set only for a crowded bin
};

class FreeBlockIndex {
 public:
  // Iterates in (size, address) order. Holds a copy of the key it is at: any insert or erase in the index
  // invalidates it, as for any ordered container.
  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = FreeKey;
    using difference_type = std::ptrdiff_t;
    using pointer = const FreeKey*;
    using reference = const FreeKey&;

    Iterator() = default;
    const FreeKey& operator*() const { return key_; }
    const FreeKey* operator->() const { return &key_; }
    Iterator& operator++();
    Iterator operator++(int) {
      Iterator before = *this;
      ++*this;
      return before;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) {
      return a.bin_ == b.bin_ && (a.bin_ == kEnd || a.key_ == b.key_);
    }

   private:
    friend class FreeBlockIndex;
    static constexpr std::size_t kEnd = ~std::size_t{0};
    Iterator(const FreeBlockIndex* index, std::size_t bin, const FreeBin::Position& pos)
        : index_(index), bin_(bin), key_(*pos.key), pos_(pos) {}

    const FreeBlockIndex* index_ = nullptr;
    std::size_t bin_ = kEnd;
    FreeKey key_{};
    FreeBin::Position pos_;  // key_'s place in its bin, for Erase(Iterator)
  };
  using iterator = Iterator;
  using const_iterator = Iterator;

  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  Iterator begin() const { return FirstFrom(0); }
  Iterator end() const { return Iterator(); }

  // The first key of size >= `size` (lowest address among equals): the best fit for `size`. end() if none.
  Iterator LowerBound(std::size_t size) const;
  // The largest size held; the index must not be empty.
  std::size_t LargestSize() const;

  // Insert returns false (and changes nothing) for a key already there; erase returns false for one not.
  bool Insert(const FreeKey& key);
  bool Erase(const FreeKey& key);
  // Erases the key `it` is at; no insert or erase may have happened since `it` was made.
  void Erase(const Iterator& it);
  bool Contains(const FreeKey& key) const;

  // The bin of a size: kSubBins bins per power of two above kSubBins bytes, exact below. Monotone in `size`.
  static constexpr int kSubBits = 5;
  static constexpr std::size_t kSubBins = std::size_t{1} << kSubBits;
  static std::size_t BinOf(std::size_t size) {
    if (size < kSubBins) return size;
    const int log = std::bit_width(size) - 1;  // >= kSubBits
    const std::size_t sub = (size >> (log - kSubBits)) & (kSubBins - 1);
    return (static_cast<std::size_t>(log - kSubBits + 1) << kSubBits) + sub;
  }

 private:
  static constexpr std::size_t kBins = std::size_t{64 - kSubBits + 1} << kSubBits;  // BinOf(2^64 - 1) + 1
  static constexpr std::size_t kWords = (kBins + 63) / 64;
  static_assert(kWords <= 64, "the summary word has one bit per bitmap word");

  // The first non-empty bin >= `bin`, or kEnd.
  std::size_t NextBin(std::size_t bin) const;
  Iterator FirstFrom(std::size_t bin) const;
  void MarkNonEmpty(std::size_t bin);
  void MarkEmpty(std::size_t bin);

  std::vector<FreeBin> bins_;                     // grown to the highest bin used, on demand
  std::array<std::uint64_t, kWords> nonempty_{};  // bit b: bins_[b] holds a key
  std::uint64_t nonempty_words_ = 0;              // bit w: nonempty_[w] != 0
  std::size_t size_ = 0;
};

// The operations of the allocation and free paths, inline; the crowded-bin paths are in the .cc.

inline FreeBin::Position FreeBin::Find(const FreeKey& key) const {
  Position pos;
  if (tree_ != nullptr) {
    pos.tree = tree_->lower_bound(key);
    if (pos.tree != tree_->end()) pos.key = &*pos.tree;
    return pos;
  }
  pos.flat = static_cast<std::size_t>(std::lower_bound(flat_.begin(), flat_.end(), key) - flat_.begin());
  if (pos.flat < flat_.size()) pos.key = &flat_[pos.flat];
  return pos;
}

inline FreeBin::Position FreeBin::Front() const {
  Position pos;
  if (tree_ != nullptr) {
    pos.tree = tree_->begin();
    pos.key = &*pos.tree;
  } else {
    pos.key = &flat_.front();
  }
  return pos;
}

inline void FreeBin::EraseAt(const Position& pos) {
  if (tree_ != nullptr) {
    tree_->erase(pos.tree);
    if (tree_->size() <= kToFlat) ToFlat();
    return;
  }
  flat_.erase(flat_.begin() + static_cast<std::ptrdiff_t>(pos.flat));
}

inline bool FreeBin::Contains(const FreeKey& key) const {
  const FreeKey* found = LowerBound(key);
  return found != nullptr && *found == key;
}

inline FreeBlockIndex::Iterator FreeBlockIndex::FirstFrom(std::size_t bin) const {
  const std::size_t b = NextBin(bin);
  return b == Iterator::kEnd ? Iterator() : Iterator(this, b, bins_[b].Front());
}

inline std::size_t FreeBlockIndex::NextBin(std::size_t bin) const {
  std::size_t word = bin / 64;
  if (word >= kWords) return Iterator::kEnd;
  const std::uint64_t here = nonempty_[word] & (~std::uint64_t{0} << (bin % 64));
  if (here != 0) return word * 64 + static_cast<std::size_t>(std::countr_zero(here));
  const std::uint64_t later = word + 1 < 64 ? nonempty_words_ & (~std::uint64_t{0} << (word + 1)) : 0;
  if (later == 0) return Iterator::kEnd;
  word = static_cast<std::size_t>(std::countr_zero(later));
  return word * 64 + static_cast<std::size_t>(std::countr_zero(nonempty_[word]));
}

inline FreeBlockIndex::Iterator FreeBlockIndex::LowerBound(std::size_t size) const {
  const std::size_t bin = BinOf(size);
  if (bin < bins_.size()) {
    const FreeBin::Position pos = bins_[bin].Find(FreeKey{size, 0, nullptr});
    if (pos.key != nullptr) return Iterator(this, bin, pos);
  }
  return FirstFrom(bin + 1);
}

inline FreeBlockIndex::Iterator& FreeBlockIndex::Iterator::operator++() {
  // The first key after (size, ptr) is the first at or after (size, ptr + 1): addresses are integers.
  const FreeKey after = key_.ptr != ~DevicePtr{0} ? FreeKey{key_.size, key_.ptr + 1, nullptr}
                                                  : FreeKey{key_.size + 1, 0, nullptr};
  if (const FreeBin::Position next = index_->bins_[bin_].Find(after); next.key != nullptr) {
    key_ = *next.key;
    pos_ = next;
  } else {
    *this = index_->FirstFrom(bin_ + 1);
  }
  return *this;
}

inline bool FreeBlockIndex::Insert(const FreeKey& key) {
  const std::size_t bin = BinOf(key.size);
  if (bin >= bins_.size()) bins_.resize(bin + 1);
  if (!bins_[bin].Insert(key)) return false;
  MarkNonEmpty(bin);
  ++size_;
  return true;
}

inline bool FreeBlockIndex::Erase(const FreeKey& key) {
  const std::size_t bin = BinOf(key.size);
  if (bin >= bins_.size() || !bins_[bin].Erase(key)) return false;
  if (bins_[bin].empty()) MarkEmpty(bin);
  --size_;
  return true;
}

inline void FreeBlockIndex::Erase(const Iterator& it) {
  FreeBin& bin = bins_[it.bin_];
  bin.EraseAt(it.pos_);
  if (bin.empty()) MarkEmpty(it.bin_);
  --size_;
}

inline bool FreeBlockIndex::Contains(const FreeKey& key) const {
  const std::size_t bin = BinOf(key.size);
  return bin < bins_.size() && bins_[bin].Contains(key);
}

inline void FreeBlockIndex::MarkNonEmpty(std::size_t bin) {
  nonempty_[bin / 64] |= std::uint64_t{1} << (bin % 64);
  nonempty_words_ |= std::uint64_t{1} << (bin / 64);
}

inline void FreeBlockIndex::MarkEmpty(std::size_t bin) {
  nonempty_[bin / 64] &= ~(std::uint64_t{1} << (bin % 64));
  if (nonempty_[bin / 64] == 0) nonempty_words_ &= ~(std::uint64_t{1} << (bin / 64));
}

inline bool FreeBin::Insert(const FreeKey& key) {
  if (tree_ != nullptr) return tree_->insert(key).second;
  auto it = std::lower_bound(flat_.begin(), flat_.end(), key);
  if (it != flat_.end() && *it == key) return false;
  flat_.insert(it, key);
  if (flat_.size() > kToTree) ToTree();
  return true;
}

inline bool FreeBin::Erase(const FreeKey& key) {
  if (tree_ != nullptr) {
    if (tree_->erase(key) == 0) return false;
    if (tree_->size() <= kToFlat) ToFlat();
    return true;
  }
  auto it = std::lower_bound(flat_.begin(), flat_.end(), key);
  if (it == flat_.end() || !(*it == key)) return false;
  flat_.erase(it);
  return true;
}

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_FREE_BLOCK_INDEX_H_
