// A pointer's device, found without any allocator's lock (AddressOwners): each allocator lists its
// segments' address ranges while they exist, so that the PyTorch backend frees a pointer on its own device
// only (it used to call Free on every device's allocator and match the error text "unknown pointer", locking
// every shard of each wrong one). A granule two devices share is answered exactly too.
#include "graphalloc/allocator/core/address_owners.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "graphalloc/allocator/core/caching_allocator.h"
#include "graphalloc/allocator/device/sim_driver.h"
#include "gtest/gtest.h"

namespace graphalloc {
namespace {

std::unique_ptr<CachingAllocator> AllocatorOn(int ordinal, bool expandable) {
  SimDriverOptions sim;
  sim.ordinal = ordinal;
  absl::StatusOr<std::unique_ptr<SimDriver>> driver = SimDriver::Create(sim);
  EXPECT_TRUE(driver.ok());
  Config config;
  config.expandable_segments = expandable;
  absl::StatusOr<std::unique_ptr<CachingAllocator>> a =
      CachingAllocator::Create(std::shared_ptr<Driver>(std::move(*driver)), config);
  EXPECT_TRUE(a.ok());
  return std::move(*a);
}

TEST(AddressOwnersTest, EveryBlockOfEachAllocatorNamesItsDevice) {
  for (bool expandable : {false, true}) {
    std::unique_ptr<CachingAllocator> zero = AllocatorOn(0, expandable);
    std::unique_ptr<CachingAllocator> three = AllocatorOn(3, expandable);
    std::vector<std::pair<DevicePtr, int>> blocks;
    for (std::size_t size : {std::size_t{512}, std::size_t{3} << 20, std::size_t{40} << 20}) {
      blocks.emplace_back(*zero->Allocate(size), 0);
      blocks.emplace_back(*three->Allocate(size), 3);
    }
    for (const auto& [ptr, device] : blocks) {
      EXPECT_EQ(AddressOwners::Global().DeviceOf(ptr), device) << std::hex << ptr;
      EXPECT_EQ(AddressOwners::Global().DeviceOf(ptr + 256), device);  // inside the block too
    }
    for (const auto& [ptr, device] : blocks) ASSERT_TRUE((device == 0 ? zero : three)->Free(ptr).ok());
    ASSERT_TRUE(zero->CheckInvariants().ok());
    ASSERT_TRUE(three->CheckInvariants().ok());
    const DevicePtr gone = blocks.back().first;
    three.reset();  // its segments go with it
    EXPECT_EQ(AddressOwners::Global().DeviceOf(gone), -1);
    EXPECT_EQ(AddressOwners::Global().DeviceOf(0x1000), -1);  // never reserved
  }
}

TEST(AddressOwnersTest, AReleasedSegmentIsNoLongerTheDevices) {
  std::unique_ptr<CachingAllocator> a = AllocatorOn(1, /*expandable=*/false);
  const DevicePtr p = *a->Allocate(30 << 20);
  EXPECT_EQ(AddressOwners::Global().DeviceOf(p), 1);
  ASSERT_TRUE(a->Free(p).ok());
  ASSERT_TRUE(a->EmptyCache().ok());
  EXPECT_EQ(AddressOwners::Global().DeviceOf(p), -1);
}

TEST(AddressOwnersTest, AGranuleTwoDevicesShareIsAnsweredExactly) {
  AddressOwners owners;
  const DevicePtr granule = DevicePtr{0x7f0000000000};
  owners.Add(granule, 1 << 20, 1);              // the first half of a 2 MiB granule: device 1
  owners.Add(granule + (1 << 20), 1 << 20, 2);  // the second half: device 2
  EXPECT_EQ(owners.DeviceOf(granule + 100), 1);
  EXPECT_EQ(owners.DeviceOf(granule + (1 << 20) + 100), 2);
  owners.Remove(granule, 1 << 20, 1);
  EXPECT_EQ(owners.DeviceOf(granule + (1 << 20) + 100), 2);  // the granule is device 2's alone again
  owners.Remove(granule + (1 << 20), 1 << 20, 2);
  EXPECT_EQ(owners.DeviceOf(granule + (1 << 20) + 100), -1);
  // Past 48 bits: the exact ranges answer.
  const DevicePtr high = DevicePtr{1} << 50;
  owners.Add(high, 4 << 20, 5);
  EXPECT_EQ(owners.DeviceOf(high + 3 * (1 << 20)), 5);
  EXPECT_EQ(owners.DeviceOf(high + (4 << 20)), -1);
}

}  // namespace
}  // namespace graphalloc
