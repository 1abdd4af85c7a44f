// A Driver decorator whose addresses depend only on the sequence of calls made to it, not on where the
// host's mmap puts the simulated device's memory (ASLR, other mappings of the process). The allocator's
// decisions depend on address order (best fit breaks ties by address), so with the plain simulated device
// two runs of the same workload may decide differently; through this driver they decide identically,
// which is what a test that pins every decision needs.
//
// AddressReserve and MemAlloc hand out addresses from a bump pointer (never reused); every call that takes
// an address translates it back to the wrapped driver's. The addresses are not host addresses: work that
// touches memory (copies, fills, host functions reading it) must not go through this driver.
#ifndef GRAPHALLOC_TESTS_TESTING_STABLE_ADDRESS_DRIVER_H_
#define GRAPHALLOC_TESTS_TESTING_STABLE_ADDRESS_DRIVER_H_

#include <map>
#include <memory>

#include "graphalloc/allocator/base/mutex.h"
#include "graphalloc/allocator/device/forwarding_driver.h"

namespace graphalloc::testing {

class StableAddressDriver final : public ForwardingDriver {
 public:
  explicit StableAddressDriver(std::shared_ptr<Driver> inner) : ForwardingDriver(std::move(inner)) {}

  absl::StatusOr<DevicePtr> AddressReserve(std::size_t size, std::size_t alignment = 0) override;
  absl::Status AddressFree(DevicePtr ptr, std::size_t size) override;
  absl::StatusOr<DevicePtr> MemAlloc(std::size_t size) override;
  absl::Status MemFree(DevicePtr ptr) override;
  absl::Status MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) override;
  absl::Status MemUnmap(DevicePtr ptr, std::size_t size) override;
  absl::Status MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers = {}) override;

 private:
  struct Range {
    DevicePtr inner_base;
    std::size_t size;
  };
  // A stable address for a new range of the wrapped driver at `inner_base`.
  DevicePtr Claim(DevicePtr inner_base, std::size_t size, std::size_t alignment);
  // The wrapped driver's address for `ptr` (unchanged when no range holds it: its error reports it).
  DevicePtr ToInner(DevicePtr ptr) const;
  void Forget(DevicePtr ptr);

  mutable Mutex mu_;
  std::map<DevicePtr, Range> ranges_ ABSL_GUARDED_BY(mu_);
  DevicePtr next_ ABSL_GUARDED_BY(mu_) = DevicePtr{1} << 44;
};

}  // namespace graphalloc::testing

#endif  // GRAPHALLOC_TESTS_TESTING_STABLE_ADDRESS_DRIVER_H_
