#include "graphalloc/allocator/core/address_owners.h"

namespace graphalloc {

AddressOwners& AddressOwners::Global() {
  static AddressOwners* owners = new AddressOwners();  // never destroyed: allocators die during exit too
  return *owners;
}

AddressOwners::AddressOwners() = default;

AddressOwners::~AddressOwners() {
  for (std::atomic<Leaf*>& leaf : leaves_) delete leaf.load(std::memory_order_relaxed);
}

std::atomic<std::uint32_t>* AddressOwners::Entry(std::uint64_t granule, bool make) {
  const std::uint64_t leaf_index = granule >> kLeafBits;
  if (leaf_index >= kLeaves) return nullptr;
  Leaf* leaf = leaves_[leaf_index].load(std::memory_order_acquire);
  if (leaf == nullptr) {
    if (!make) return nullptr;
    leaf = new Leaf();
    leaves_[leaf_index].store(leaf, std::memory_order_release);
  }
  return &leaf->entries[granule & ((std::uint64_t{1} << kLeafBits) - 1)];
}

void AddressOwners::Add(DevicePtr base, std::size_t size, int device) {
  if (size == 0) return;
  MutexLock lock(&mu_);
  ranges_[base] = {base + size, device};
  const auto owner = static_cast<std::uint32_t>(device + 1);
  for (std::uint64_t g = base >> kGranuleShift; g <= (base + size - 1) >> kGranuleShift; ++g) {
    std::atomic<std::uint32_t>* entry = Entry(g, /*make=*/true);
    if (entry == nullptr) break;  // past 48 bits: the exact ranges answer
    const std::uint32_t old = entry->load(std::memory_order_relaxed);
    const std::uint32_t count = (old & 0xffffff) + 1;
    const std::uint32_t was = old >> 24;
    const std::uint32_t now = was == 0 || was == owner ? owner : kShared;
    entry->store(now << 24 | count, std::memory_order_release);
  }
}

void AddressOwners::Remove(DevicePtr base, std::size_t size, int device) {
  if (size == 0) return;
  MutexLock lock(&mu_);
  auto it = ranges_.find(base);
  if (it != ranges_.end() && it->second.second == device) ranges_.erase(it);
  for (std::uint64_t g = base >> kGranuleShift; g <= (base + size - 1) >> kGranuleShift; ++g) {
    std::atomic<std::uint32_t>* entry = Entry(g, /*make=*/false);
    if (entry == nullptr) continue;
    const std::uint32_t old = entry->load(std::memory_order_relaxed);
    const std::uint32_t count = (old & 0xffffff) - 1;
    const std::uint32_t owner = count == 0 ? 0 : (old >> 24 == kShared ? OwnerFromRanges(g) : old >> 24);
    entry->store(owner << 24 | count, std::memory_order_release);
  }
}

std::uint32_t AddressOwners::OwnerFromRanges(std::uint64_t granule) const {
  const DevicePtr begin = granule << kGranuleShift;
  const DevicePtr end = begin + (DevicePtr{1} << kGranuleShift);
  std::uint32_t owner = 0;
  // Ranges are disjoint and sorted: those touching the granule start before its end, the first of them
  // possibly before its beginning.
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin()) --it;
  for (; it != ranges_.end() && it->first < end; ++it) {
    if (it->second.first <= begin) continue;
    const auto device = static_cast<std::uint32_t>(it->second.second + 1);
    owner = owner == 0 || owner == device ? device : kShared;
  }
  return owner;
}

int AddressOwners::DeviceFromRanges(DevicePtr ptr) const {
  MutexLock lock(&mu_);
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return -1;
  --it;
  return ptr < it->second.first ? it->second.second : -1;
}

int AddressOwners::DeviceOf(DevicePtr ptr) const {
  const std::uint64_t granule = ptr >> kGranuleShift;
  const std::uint64_t leaf_index = granule >> kLeafBits;
  if (leaf_index >= kLeaves) return DeviceFromRanges(ptr);
  const Leaf* leaf = leaves_[leaf_index].load(std::memory_order_acquire);
  if (leaf == nullptr) return -1;
  const std::uint32_t owner =
      leaf->entries[granule & ((std::uint64_t{1} << kLeafBits) - 1)].load(std::memory_order_acquire) >> 24;
  if (owner == 0) return -1;
  if (owner != kShared) {
    // The granule is this device's, but the range may end (or begin) inside it: only an exact lookup
    // tells an address between two ranges from one inside. Inside a range is what a free passes.
    return static_cast<int>(owner) - 1;
  }
  return DeviceFromRanges(ptr);
}

}  // namespace graphalloc
