// Which device's allocator reserved an address: the owner of a pointer, found without taking any
// allocator's lock, for code that frees pointers of several devices (the PyTorch backend's deleter).
//
// Every allocator lists the address ranges of its segments here (regular segments, and the whole reserved
// range of expandable ones) while they exist (SegmentLedger). Reads are lock-free: the address space is cut
// into 2 MiB granules, and a two-level table (48-bit addresses) holds, per granule, the device that
// reserved it and how many ranges touch it; a lookup is two atomic loads. A granule two devices share (CUDA
// allocates device memory 2 MiB-aligned, so this is not seen there, but separate simulated devices in one
// process can), and an address past 48 bits, are looked up in the exact list of ranges under this
// registry's own lock, never an allocator's. Writers (segment creation and release, the slow path) take
// that lock too.
#ifndef GRAPHALLOC_ALLOCATOR_CORE_ADDRESS_OWNERS_H_
#define GRAPHALLOC_ALLOCATOR_CORE_ADDRESS_OWNERS_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/driver.h"

namespace graphalloc {

class AddressOwners {
 public:
  // The process's registry.
  static AddressOwners& Global();

  AddressOwners();
  ~AddressOwners();
  AddressOwners(const AddressOwners&) = delete;
  AddressOwners& operator=(const AddressOwners&) = delete;

  // [base, base + size) is reserved by `device`'s allocator (0 <= device < 255), or no longer.
  void Add(DevicePtr base, std::size_t size, int device);
  void Remove(DevicePtr base, std::size_t size, int device);
  // The device whose allocator reserved `ptr`; -1 when none did.
  int DeviceOf(DevicePtr ptr) const;

 private:
  static constexpr int kGranuleShift = 21;  // 2 MiB
  static constexpr int kLeafBits = 12;      // granules per leaf: 8 GiB of addresses
  static constexpr std::size_t kLeaves = std::size_t{1} << (48 - kGranuleShift - kLeafBits);
  // An entry: the owner in the top 8 bits (0: none; device + 1; kShared: several devices), the number of
  // ranges touching the granule below.
  static constexpr std::uint32_t kShared = 255;
  struct Leaf {
    std::array<std::atomic<std::uint32_t>, std::size_t{1} << kLeafBits> entries{};
  };

  std::atomic<std::uint32_t>* Entry(std::uint64_t granule, bool make) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner of `granule` from the exact ranges (after a removal left it shared).
  std::uint32_t OwnerFromRanges(std::uint64_t granule) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int DeviceFromRanges(DevicePtr ptr) const;

  std::array<std::atomic<Leaf*>, kLeaves> leaves_{};
  mutable Mutex mu_;
  // Every range, exactly: base -> (end, device).
  absl::btree_map<DevicePtr, std::pair<DevicePtr, int>> ranges_ ABSL_GUARDED_BY(mu_);
};

}  // namespace graphalloc

#endif  // GRAPHALLOC_ALLOCATOR_CORE_ADDRESS_OWNERS_H_
