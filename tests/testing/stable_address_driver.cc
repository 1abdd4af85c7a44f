#include "tests/testing/stable_address_driver.h"

#include <algorithm>

#include "graphalloc/allocator/base/bytes.h"

namespace graphalloc::testing {

DevicePtr StableAddressDriver::Claim(DevicePtr inner_base, std::size_t size, std::size_t alignment) {
  MutexLock lock(&mu_);
  const DevicePtr base = RoundUp(next_, std::max<std::size_t>(alignment, Info().granularity));
  next_ = base + RoundUp(size, Info().granularity);
  ranges_.emplace(base, Range{inner_base, size});
  return base;
}

DevicePtr StableAddressDriver::ToInner(DevicePtr ptr) const {
  MutexLock lock(&mu_);
  auto it = ranges_.upper_bound(ptr);
  if (it == ranges_.begin()) return ptr;
  --it;
  if (ptr >= it->first + std::max<std::size_t>(it->second.size, 1)) return ptr;
  return it->second.inner_base + (ptr - it->first);
}

void StableAddressDriver::Forget(DevicePtr ptr) {
  MutexLock lock(&mu_);
  ranges_.erase(ptr);
}

absl::StatusOr<DevicePtr> StableAddressDriver::AddressReserve(std::size_t size, std::size_t alignment) {
  absl::StatusOr<DevicePtr> inner_base = inner().AddressReserve(size, alignment);
  if (!inner_base.ok()) return inner_base;
  return Claim(*inner_base, size, alignment);
}

absl::Status StableAddressDriver::AddressFree(DevicePtr ptr, std::size_t size) {
  absl::Status s = inner().AddressFree(ToInner(ptr), size);
  if (s.ok()) Forget(ptr);
  return s;
}

absl::StatusOr<DevicePtr> StableAddressDriver::MemAlloc(std::size_t size) {
  absl::StatusOr<DevicePtr> inner_base = inner().MemAlloc(size);
  if (!inner_base.ok() || *inner_base == 0) return inner_base;
  return Claim(*inner_base, size, 0);
}

absl::Status StableAddressDriver::MemFree(DevicePtr ptr) {
  absl::Status s = inner().MemFree(ToInner(ptr));
  if (s.ok()) Forget(ptr);
  return s;
}

absl::Status StableAddressDriver::MemMap(DevicePtr ptr, std::size_t size, PhysicalHandle handle) {
  return inner().MemMap(ToInner(ptr), size, handle);
}

absl::Status StableAddressDriver::MemUnmap(DevicePtr ptr, std::size_t size) {
  return inner().MemUnmap(ToInner(ptr), size);
}

absl::Status StableAddressDriver::MemSetAccess(DevicePtr ptr, std::size_t size, std::span<const int> peers) {
  return inner().MemSetAccess(ToInner(ptr), size, peers);
}

}  // namespace graphalloc::testing
